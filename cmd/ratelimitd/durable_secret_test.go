package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
)

// TestDurableURLErrorHidesPassword: a --durable-url (or
// RATELIMITD_DURABLE_URL) that serve refuses, a libpq key/value string or
// a URL whose password has characters a URL reserves, is refused without
// its password in the error, and the error says how to give the password.
func TestDurableURLErrorHidesPassword(t *testing.T) {
	for _, c := range []struct{ url, pw string }{
		{"host=127.0.0.1 port=25432 user=pgadmin password=DsnPw55 dbname=ratelimitd", "DsnPw55"},
		{"host=127.0.0.1 user=pgadmin password='Dsn Pw 66' dbname=ratelimitd", "Dsn Pw 66"},
		{"postgres://pgadmin:Pw#hash77@127.0.0.1:25432/ratelimitd", "Pw#hash77"},
		{"postgres://pgadmin:Pw/slash88@127.0.0.1:25432/ratelimitd", "Pw/slash88"},
		{"postgres://pgadmin:Pw?q99@127.0.0.1:25432/ratelimitd", "Pw?q99"},
		{"postgres://pgadmin:Pw sp11@127.0.0.1:25432/ratelimitd", "Pw sp11"},
		{"postgres://pgadmin:Pw%zz22@127.0.0.1:25432/ratelimitd", "Pw%zz22"},
	} {
		for _, how := range []string{"flag", "env"} {
			var out, errb bytes.Buffer
			args, lookup := []string{"serve", "--durable-url", c.url}, env()
			if how == "env" {
				args, lookup = []string{"serve"}, env("RATELIMITD_DURABLE_URL", c.url)
			}
			if code := run(context.Background(), args, lookup, &out, &errb); code != 2 {
				t.Fatalf("%s %q: exit %d, want 2; stderr:\n%s", how, c.url, code, errb.String())
			}
			text := out.String() + errb.String()
			for _, form := range []string{c.pw, url.PathEscape(c.pw), url.QueryEscape(c.pw), strings.Fields(c.pw)[0]} {
				if strings.Contains(text, form) {
					t.Errorf("%s %q: the password is shown (%q):\n%s", how, c.url, form, text)
				}
			}
			if !strings.Contains(text, "percent-encode") {
				t.Errorf("%s %q: no hint to percent-encode the password:\n%s", how, c.url, text)
			}
		}
	}
}
