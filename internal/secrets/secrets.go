// Package secrets redacts and scrubs the credentials ratelimitd is given
// (docs/security.md, "Secrets"): in the values of flags whose setting
// declares a Kind, in the command line /debug/pprof/cmdline serves, and in
// error texts; and it reads secret files. None of them is ever written
// back: log lines and errors show such a value redacted (a URL that does
// not parse not at all).
package secrets

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

// Redacted replaces a secret wherever ratelimitd prints one (the same
// text as redis.RedactURL).
const Redacted = "xxxxx"

// Kind says what of a setting's value is a credential.
type Kind int

// The kinds of secret a setting may declare.
const (
	// None: the value holds no credential.
	None Kind = iota
	// Whole: the whole value ("user:password").
	Whole
	// RedisURL: a Redis URL (redis.RedactURL).
	RedisURL
	// Address: a URL or an address, or a comma-separated list of
	// them, whose user info ("user:password@") is a credential.
	Address
	// Headers: "name:value,name2:value2" whose values are
	// credentials (bearer tokens).
	Headers
	// PostgresURL: a postgres:// URL (postgres.RedactURL: its
	// password and query values).
	PostgresURL
)

// Redact returns v, a value of a setting of kind k, as ratelimitd may
// print it: a Redis URL as redis.RedactURL shows it ("xxxxx" when it does
// not parse); an address with user info with that user info replaced, and
// one that holds "@" or "://" but does not parse as a URL with user info
// as "xxxxx" (no part of it can be told apart from a password).
func Redact(k Kind, v string) string {
	switch k {
	case Whole:
		if v == "" {
			return ""
		}
		return Redacted
	case RedisURL:
		if v == "" {
			return ""
		}
		return redis.RedactURL(v)
	case PostgresURL:
		if v == "" {
			return ""
		}
		return postgres.RedactURL(v)
	case Address:
		items := strings.Split(v, ",")
		for i, it := range items {
			items[i] = redactAddress(it)
		}
		return strings.Join(items, ",")
	case Headers:
		items := strings.Split(v, ",")
		for i, it := range items {
			if name, _, ok := strings.Cut(it, ":"); ok {
				items[i] = name + ":" + Redacted
			} else if strings.TrimSpace(it) != "" {
				items[i] = Redacted
			}
		}
		return strings.Join(items, ",")
	}
	return v
}

// redactAddress is one item of an Address value as Redact shows
// it.
func redactAddress(it string) string {
	if !strings.Contains(it, "@") && !strings.Contains(it, "://") {
		return it
	}
	u, err := url.Parse(strings.TrimSpace(it))
	switch {
	case err != nil, u.Opaque != "", strings.Contains(it, "@") && u.User == nil:
		return Redacted
	case u.User != nil:
		u.User = url.User(Redacted)
	}
	return u.String()
}

// Scrub returns msg with every non-empty secret replaced by Redacted.
func Scrub(msg string, secrets ...string) string {
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, Redacted)
		}
	}
	return msg
}

// Parts are the credentials in v, a value of a setting of kind k: whole
// values, the passwords (and lone users) of URL user info, header values.
// Parts shorter than three bytes are left out: too short to scrub without
// mangling the text around them.
func Parts(k Kind, v string) []string {
	var out []string
	switch k {
	case Whole:
		out = append(out, v)
		if _, p, ok := strings.Cut(v, ":"); ok {
			out = append(out, p)
		}
	case RedisURL, Address:
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
	case Headers:
		for _, it := range strings.Split(v, ",") {
			if _, val, ok := strings.Cut(it, ":"); ok {
				out = append(out, strings.TrimSpace(val))
			}
		}
	case PostgresURL:
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

// ScrubErr returns err with every secret in its text replaced (nil for
// nil); the result wraps err for errors.Is and errors.As.
func ScrubErr(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := Scrub(err.Error(), secrets...)
	if msg == err.Error() {
		return err
	}
	return &scrubbedError{msg: msg, err: err}
}

// RedactArgs returns a copy of args (a command line, program name first)
// with the value of every flag of a secret kind (kindOf, given the flag's
// name) redacted (Redact), in every form the flag package accepts:
// -flag=v, --flag=v, -flag v and --flag v.
func RedactArgs(args []string, kindOf func(name string) Kind) []string {
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
		k := kindOf(name)
		if k == None {
			continue
		}
		if !hasVal {
			if i+1 >= len(out) {
				continue
			}
			i++
			val = out[i]
		}
		red := Redact(k, val)
		if hasVal {
			out[i] = a[:strings.Index(a, "=")+1] + red
		} else {
			out[i] = red
		}
	}
	return out
}

// CmdlineHandler serves /debug/pprof/cmdline as net/http/pprof does (the
// arguments separated by NUL bytes) with secrets redacted (RedactArgs).
func CmdlineHandler(args []string, kindOf func(name string) Kind) http.HandlerFunc {
	line := strings.Join(RedactArgs(args, kindOf), "\x00")
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, line)
	}
}

// maxFileBytes bounds a secret file: a password or token is short;
// a larger file is a mistake (a certificate, a directory listing).
const maxFileBytes = 64 << 10

// ReadFile returns the content of the secret file of flag flagName (a Kubernetes Secret
// key mounted as a file, a Vault agent sink) without its trailing newline
// (LF or CRLF). An empty, unreadable or oversized file is an error naming
// the file, never its content.
func ReadFile(flagName, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	if len(b) > maxFileBytes {
		return "", fmt.Errorf("--%s: %s is larger than %d bytes; it should hold only the secret", flagName, path, maxFileBytes)
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
