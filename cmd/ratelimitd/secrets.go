package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// Secrets handling (docs/security.md, "Secrets"). Credentials reach
// ratelimitd in one of three ways: inside --redis-url (user:password@),
// as --redis-sentinel-auth, or from files (--redis-password-file,
// --redis-sentinel-auth-file, --debug-token-file) and their RATELIMITD_*
// twins. None of them is ever written back: /debug/pprof/cmdline prints
// the command line with them redacted, log lines and errors name a URL
// with its password replaced by "xxxxx", and /rlconfig holds only rules.

// redacted replaces a secret wherever ratelimitd prints one (the same
// text as redis.RedactURL).
const redacted = "xxxxx"

// secretFlags are the flags whose whole value is a secret.
var secretFlags = map[string]bool{"redis-sentinel-auth": true}

// urlFlags are the flags whose value is a URL that may carry a password.
var urlFlags = map[string]bool{"redis-url": true}

// scrub returns msg with every non-empty secret replaced by redacted.
func scrub(msg string, secrets ...string) string {
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return msg
}

// secretsOf lists the secret values in o: the Redis URL's password, the
// sentinel credentials and their password part.
func secretsOf(o Options) []string {
	s := []string{redis.URLPassword(o.RedisURL), o.RedisSentinelAuth}
	if _, p, ok := strings.Cut(o.RedisSentinelAuth, ":"); ok {
		s = append(s, p)
	}
	return s
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
// with the values of secretFlags replaced and the passwords in urlFlags
// redacted, in every form the flag package accepts: -flag=v, --flag=v,
// -flag v and --flag v.
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
		if !secretFlags[name] && !urlFlags[name] {
			continue
		}
		if !hasVal {
			if i+1 >= len(out) {
				continue
			}
			i++
			val = out[i]
		}
		red := redacted
		if urlFlags[name] {
			red = redis.RedactURL(val)
		}
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
