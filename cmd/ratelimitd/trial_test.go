package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateSpacedFlagValues: validate reads a space-separated value of a
// non-boolean flag as that flag's (as the flag package does), not as a
// path, and refuses a space-separated value of a boolean flag.
func TestValidateSpacedFlagValues(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	writeTestFile(t, filepath.Join(dir, "d.yaml"), cfg)
	for _, c := range []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{[]string{"validate", "--backend", "memcache", dir}, 1, "algorithm sliding_window is not supported by the memcache backend"},
		{[]string{"validate", dir, "--backend", "memcache"}, 1, "algorithm sliding_window is not supported by the memcache backend"},
		{[]string{"validate", "--max-config-rules", "1", dir}, 1, "config too large: 2 rules, more than the limit of 1"},
		{[]string{"validate", "--max-config-rules", "2", dir}, 0, "ok: 1 domain(s), 2 rule(s)"},
		{[]string{"validate", "--ignore-dotfiles", "false", dir}, 2, "--ignore-dotfiles false: a boolean flag takes its value as --ignore-dotfiles=false"},
		{[]string{"validate", "--ignore-dotfiles=false", dir, "--strict"}, 0, "ok: 1 domain(s)"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(), &out, &errb)
		if code != c.code || !strings.Contains(out.String()+errb.String(), c.want) {
			t.Errorf("%q: exit %d, want %d with %q\n%s%s", c.args, code, c.code, c.want, out.String(), errb.String())
		}
	}
}
