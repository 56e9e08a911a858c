package serveopts

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// TestOwnersFollowBinding: a setting bound to a field of a package's
// options owns that field, by its path ("redis.Breaker.Window"); every
// error field a package's Validate names this way reaches its flag.
func TestOwnersFollowBinding(t *testing.T) {
	for _, c := range []struct {
		flag  string
		owner []string
	}{
		{"redis-url", []string{"redis.URL"}},
		{"redis-mode", []string{"redis.Mode"}},
		{"redis-breaker-window", []string{"redis.Breaker.Window"}},
		{"redis-breaker", []string{"redis.Breaker.Disabled"}},
		{"redis-tls-cert", []string{"redis.TLSCertFile"}},
		{"local-cache-size", []string{"redis.LocalCacheSize", "memcache.LocalCacheSize"}},
		{"memcache-srv-refresh", []string{"memcache.SRVRefresh"}},
		{"rlqs-headroom", []string{"rlqs.Headroom"}},
		{"near-limit-ratio", []string{"service.NearLimitRatio"}},
		{"log-decisions-rate", []string{"service.DecisionLogRate"}},
		{"xds-backoff-max", []string{"xds.BackoffMax"}},
		{"xds-max-msg-size", []string{"xds.MaxRecvMsgSize"}},
		{"tracing-sample-ratio", []string{"telemetry.SampleRatio"}},
		{"lease-interval", []string{"lease.Interval"}},
		{"grpc-addr", nil},
	} {
		i := slices.IndexFunc(settings, func(s setting) bool { return s.name == c.flag })
		if i < 0 {
			t.Fatalf("no setting --%s", c.flag)
		}
		if got := ownersOf(settings[i]); !slices.Equal(got, c.owner) {
			t.Errorf("--%s owns %q, want %q", c.flag, got, c.owner)
		}
	}
	// Each owned field is owned once.
	seen := map[string]string{}
	for _, s := range settings {
		for _, f := range ownersOf(s) {
			if prev, ok := seen[f]; ok {
				t.Errorf("%s owned by --%s and --%s", f, prev, s.name)
			}
			seen[f] = s.name
		}
	}
	if got := flagWords("redis.TLSCertFile", "TLSCertFile and TLSKeyFile go together"); !strings.Contains(got, "--redis-tls-cert and --redis-tls-key") {
		t.Errorf("flagWords = %q, want the flags named", got)
	}
}

// TestPackageErrorsNameTheirFlag: for every setting bound to a package
// option field, each value of a range of its type that the package's
// Validate refuses for that field is refused by Parse with an error
// naming the flag ("--flag=value: reason"; a credential's value
// redacted), not the package's field.
// Every package that owns a setting refuses some value, and every field
// a package names in a refusal belongs to a setting.
func TestPackageErrorsNameTheirFlag(t *testing.T) {
	refused := map[string]bool{}     // flags with a refused value
	refusedPkg := map[string]bool{}  // packages that refused a value
	ownerPkgs := map[string]string{} // package of an owned field -> a flag it owns
	for _, s := range settings {
		owners := ownersOf(s)
		if len(owners) == 0 {
			continue
		}
		for _, f := range owners {
			pkg, _, _ := strings.Cut(f, ".")
			ownerPkgs[pkg] = s.name
		}
		base := []string{"--config=."}
		if strings.HasPrefix(owners[0], "xds.") {
			base = append(base, "--config-source=xds")
		}
		if s.backend != "" {
			base = append(base, "--backend="+s.backend)
		}
		if s.backend == "memcache" {
			base = append(base, "--memcache-addrs=127.0.0.1:11211")
		}
		for _, v := range invalidCandidates(s.field.ptr(new(Options))) {
			o, _, err := Parse(base, env(), io.Discard)
			if err != nil {
				t.Fatalf("--%s: %q: %v", s.name, base, err)
			}
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			registerServeFlags(fs, &o)
			if err := fs.Set(s.name, v); err != nil {
				continue // not a value of the flag's type
			}
			checks, ok := packageChecks(o)
			if !ok {
				t.Fatalf("--%s=%s: the service options cannot be built", s.name, v)
			}
			var mine []*opterr.FieldError
			for _, c := range checks {
				for _, e := range leafErrors(c.err) {
					var fe *opterr.FieldError
					if !errors.As(e, &fe) {
						continue
					}
					field, _ := fe.OptionField()
					if _, ok := ownerSetting(field); !ok {
						t.Errorf("--%s=%s: %s refused %q, which no flag owns", s.name, v, fe.Package, field)
					}
					if slices.Contains(owners, field) {
						mine = append(mine, fe)
					}
				}
			}
			if len(mine) == 0 {
				continue
			}
			refused[s.name] = true
			refusedPkg[mine[0].Package] = true
			_, _, err = Parse(append(base, "--"+s.name+"="+v), env(), io.Discard)
			if err == nil {
				t.Errorf("--%s=%s: accepted, refused by %v", s.name, v, mine[0])
				continue
			}
			// The package's rule, or the command's own (a quoted word).
			named, quoted := flagEquals(s.name, fieldValue(s.field.ptr(&o)))+": ", fmt.Sprintf("--%s=%q: ", s.name, v)
			if !strings.Contains(err.Error(), named) && !strings.Contains(err.Error(), quoted) {
				t.Errorf("--%s=%s: error %q does not name the flag (%q)", s.name, v, err, named)
			}
			for _, fe := range mine {
				if strings.Contains(err.Error(), fe.Error()) {
					t.Errorf("--%s=%s: error %q carries the package's wording %q", s.name, v, err, fe)
				}
			}
		}
	}
	for pkg, flag := range ownerPkgs {
		if !refusedPkg[pkg] {
			t.Errorf("no value of a flag %s owns (--%s, ...) was refused by %s: the candidates miss its rules", pkg, flag, pkg)
		}
	}
	// The settings bound to xds, telemetry and lease options.
	for _, name := range []string{"xds-connect-retry-interval", "xds-backoff-initial", "xds-backoff-max", "xds-backoff-random-factor", "xds-max-msg-size", "tracing-sample-ratio", "lease-interval"} {
		if !refused[name] {
			t.Errorf("--%s: no value refused by its package", name)
		}
	}
}

// invalidCandidates are values, as the flag parses them, spanning the
// edges of the ranges packages refuse for a field of p's type.
func invalidCandidates(p any) []string {
	switch p.(type) {
	case *time.Duration:
		return []string{"-1s", "0s", "100us", "5ms", "1h"}
	case *int, *int64:
		return []string{"-2", "-1", "0"}
	case *float64:
		return []string{"-1", "0", "0.5", "1.5", "2", "NaN"}
	case *string, *[]string:
		return []string{"", "x", "-1", "x://"}
	case *bool, *notBool:
		return []string{"true", "false"}
	}
	return nil
}
