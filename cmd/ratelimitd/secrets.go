package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// Secrets handling (docs/security.md, "Secrets"). Credentials reach
// ratelimitd in flags whose setting declares a secret kind (the settings
// table's secret field: --redis-url's password, --redis-sentinel-auth,
// --xds-headers' values, user info in any address flag), and from files
// (--redis-password-file, --redis-sentinel-auth-file, --debug-token-file)
// and their RATELIMITD_* twins. None of them is ever written back:
// /debug/pprof/cmdline prints the command line with them redacted, log
// lines and errors show such a value redacted (a URL that does not parse
// not at all), and /rlconfig holds only rules.

// redacted replaces a secret wherever ratelimitd prints one (the same
// text as redis.RedactURL).
const redacted = "xxxxx"

// secretKind says what of a setting's value is a credential.
type secretKind int

const (
	secretNone secretKind = iota
	// secretWhole: the whole value ("user:password").
	secretWhole
	// secretRedisURL: a Redis URL (redis.RedactURL).
	secretRedisURL
	// secretAddress: a URL or an address, or a comma-separated list of
	// them, whose user info ("user:password@") is a credential.
	secretAddress
	// secretHeaders: "name:value,name2:value2" whose values are
	// credentials (bearer tokens).
	secretHeaders
	// secretPostgresURL: a postgres:// URL (postgres.RedactURL: its
	// password and query values).
	secretPostgresURL
)

// settingNamed returns the setting of flag name.
func settingNamed(name string) (setting, bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting{}, false
}

// secretKindOf is the secret kind of flag name (secretNone for an unknown
// flag).
func secretKindOf(name string) secretKind {
	s, _ := settingNamed(name)
	return s.secret
}

// redactValue returns v, a value of a setting of kind k, as ratelimitd may
// print it: a Redis URL as redis.RedactURL shows it ("xxxxx" when it does
// not parse); an address with user info with that user info replaced, and
// one that holds "@" or "://" but does not parse as a URL with user info
// as "xxxxx" (no part of it can be told apart from a password).
func redactValue(k secretKind, v string) string {
	switch k {
	case secretWhole:
		if v == "" {
			return ""
		}
		return redacted
	case secretRedisURL:
		if v == "" {
			return ""
		}
		return redis.RedactURL(v)
	case secretPostgresURL:
		if v == "" {
			return ""
		}
		return postgres.RedactURL(v)
	case secretAddress:
		items := strings.Split(v, ",")
		for i, it := range items {
			items[i] = redactAddress(it)
		}
		return strings.Join(items, ",")
	case secretHeaders:
		items := strings.Split(v, ",")
		for i, it := range items {
			if name, _, ok := strings.Cut(it, ":"); ok {
				items[i] = name + ":" + redacted
			} else if strings.TrimSpace(it) != "" {
				items[i] = redacted
			}
		}
		return strings.Join(items, ",")
	}
	return v
}

// redactAddress is one item of a secretAddress value as redactValue shows
// it.
func redactAddress(it string) string {
	if !strings.Contains(it, "@") && !strings.Contains(it, "://") {
		return it
	}
	u, err := url.Parse(strings.TrimSpace(it))
	switch {
	case err != nil, u.Opaque != "", strings.Contains(it, "@") && u.User == nil:
		return redacted
	case u.User != nil:
		u.User = url.User(redacted)
	}
	return u.String()
}

// flagEquals is "--name=value" for an error, the value redacted by the
// setting's secret kind; "--name" alone for a Redis URL (the redis
// package's errors about it say it is not shown) and for an address that
// does not parse (no part of it is shown).
func flagEquals(name string, v any) string {
	k := secretKindOf(name)
	if k == secretNone {
		return fmt.Sprintf("--%s=%v", name, v)
	}
	red := redactValue(k, fmt.Sprint(v))
	if k == secretRedisURL || k == secretPostgresURL || (k == secretAddress && slices.Contains(strings.Split(red, ","), redacted)) {
		return "--" + name
	}
	return "--" + name + "=" + red
}

// scrub returns msg with every non-empty secret replaced by redacted.
func scrub(msg string, secrets ...string) string {
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return msg
}

// secretsOf lists the secret values in o, for every setting that declares
// a secret kind: whole values, the passwords (and lone users) of URL user
// info, header values.
func secretsOf(o Options) []string {
	var out []string
	for _, s := range settings {
		if s.secret != secretNone {
			out = append(out, secretParts(s.secret, fmt.Sprint(fieldValue(s.field.ptr(&o))))...)
		}
	}
	return out
}

// secretParts are the credentials in v, a value of a setting of kind k.
func secretParts(k secretKind, v string) []string {
	var out []string
	switch k {
	case secretWhole:
		out = append(out, v)
		if _, p, ok := strings.Cut(v, ":"); ok {
			out = append(out, p)
		}
	case secretRedisURL, secretAddress:
		for _, it := range strings.Split(v, ",") {
			out = append(out, redis.URLPassword(it))
			if at := strings.LastIndex(it, "@"); at >= 0 {
				cred := it[:at]
				if i := strings.Index(cred, "://"); i >= 0 {
					cred = cred[i+3:]
				}
				if u, p, ok := strings.Cut(cred, ":"); ok {
					out = append(out, p)
				} else {
					out = append(out, u)
				}
			}
		}
	case secretHeaders:
		for _, it := range strings.Split(v, ",") {
			if _, val, ok := strings.Cut(it, ":"); ok {
				out = append(out, strings.TrimSpace(val))
			}
		}
	case secretPostgresURL:
		// The password of the user info and of the query (libpq takes
		// password= and sslpassword= there), or of a key/value string.
		out = append(out, postgres.URLPasswords(v)...)
	}
	// Too short to scrub without mangling the text around them.
	return slices.DeleteFunc(out, func(s string) bool { return len(s) < 3 })
}

// scrubbedError is an error whose text had secrets removed; it keeps the
// original for errors.Is/As.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrubErr returns err with every secret in its text replaced (nil for
// nil).
func scrubErr(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := scrub(err.Error(), secrets...)
	if msg == err.Error() {
		return err
	}
	return &scrubbedError{msg: msg, err: err}
}

// redactArgs returns a copy of args (a command line, program name first)
// with the value of every flag whose setting declares a secret kind
// redacted (redactValue), in every form the flag package accepts:
// -flag=v, --flag=v, -flag v and --flag v.
func redactArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i := 1; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(a, "-")
		name, val, hasVal := strings.Cut(name, "=")
		k := secretKindOf(name)
		if k == secretNone {
			continue
		}
		if !hasVal {
			if i+1 >= len(out) {
				continue
			}
			i++
			val = out[i]
		}
		red := redactValue(k, val)
		if hasVal {
			out[i] = a[:strings.Index(a, "=")+1] + red
		} else {
			out[i] = red
		}
	}
	return out
}

// cmdlineHandler serves /debug/pprof/cmdline as net/http/pprof does (the
// arguments separated by NUL bytes) with secrets redacted (redactArgs).
func cmdlineHandler(args []string) http.HandlerFunc {
	line := strings.Join(redactArgs(args), "\x00")
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, line)
	}
}

// maxSecretFileBytes bounds a secret file: a password or token is short;
// a larger file is a mistake (a certificate, a directory listing).
const maxSecretFileBytes = 64 << 10

// readSecretFile returns the content of a secret file (a Kubernetes Secret
// key mounted as a file, a Vault agent sink) without its trailing newline
// (LF or CRLF). An empty, unreadable or oversized file is an error naming
// the file, never its content.
func readSecretFile(flagName, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	if len(b) > maxSecretFileBytes {
		return "", fmt.Errorf("--%s: %s is larger than %d bytes; it should hold only the secret", flagName, path, maxSecretFileBytes)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("--%s: %s is empty", flagName, path)
	}
	if strings.ContainsAny(s, "\r\n") {
		return "", errors.New("--" + flagName + ": " + path + " holds more than one line; it should hold only the secret")
	}
	return s, nil
}
