package serveopts

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/secrets"
)

// The settings table declares which flags carry credentials (its secret
// field); internal/secrets redacts and scrubs them (docs/security.md,
// "Secrets").

// settingNamed returns the setting of flag name.
func settingNamed(name string) (setting, bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting{}, false
}

// SecretKindOf is the secret kind of flag name (secrets.None for an unknown
// flag).
func SecretKindOf(name string) secrets.Kind {
	s, _ := settingNamed(name)
	return s.secret
}

// flagEquals is "--name=value" for an error, the value redacted by the
// setting's secret kind; "--name" alone for a Redis URL (the redis
// package's errors about it say it is not shown) and for an address that
// does not parse (no part of it is shown).
func flagEquals(name string, v any) string {
	k := SecretKindOf(name)
	if k == secrets.None {
		return fmt.Sprintf("--%s=%v", name, v)
	}
	red := secrets.Redact(k, fmt.Sprint(v))
	if k == secrets.RedisURL || k == secrets.PostgresURL || (k == secrets.Address && slices.Contains(strings.Split(red, ","), secrets.Redacted)) {
		return "--" + name
	}
	return "--" + name + "=" + red
}

// Secrets lists the secret values in o, for every setting that declares
// a secret kind: whole values, the passwords (and lone users) of URL user
// info, header values.
func Secrets(o Options) []string {
	var out []string
	for _, s := range settings {
		if s.secret != secrets.None {
			out = append(out, secrets.Parts(s.secret, fmt.Sprint(fieldValue(s.field.ptr(&o))))...)
		}
	}
	return out
}
