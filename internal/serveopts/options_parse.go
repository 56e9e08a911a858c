// Parsing serve's command line and RATELIMITD_* twins into Options.

package serveopts

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// listValue is a repeatable/comma-separated string list flag. The first Set
// from each source (environment, then command line) replaces the value
// inherited from the previous source; later Sets of the same source append.
type listValue struct {
	p       *[]string
	touched bool
}

func (v *listValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *listValue) Set(s string) error {
	if !v.touched {
		*v.p = nil
		v.touched = true
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*v.p = append(*v.p, part)
		}
	}
	return nil
}

// envName is the RATELIMITD_* twin of a flag: "redis-url" → "RATELIMITD_REDIS_URL".
func envName(flagName string) string {
	return "RATELIMITD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse turns serve's arguments and the environment into validated
// Options. lookup is os.LookupEnv in production. Warnings are non-fatal
// remarks for the startup log (at most one line naming every unsupported
// envoyproxy/ratelimit variable). Errors name the offending flag or
// variable; flag.ErrHelp is returned for -h.
func Parse(args []string, lookup func(string) (string, bool), usage io.Writer) (Options, []string, error) {
	return ParseAs(false, args, lookup, usage)
}

// ParseAs is Parse for a binary invoked as envoyproxy/ratelimit's
// (asRef: its name is ratelimit), which selects reference mode under
// --mode=auto.
func ParseAs(asRef bool, args []string, lookup func(string) (string, bool), usage io.Writer) (Options, []string, error) {
	o := Defaults()
	warnings, err := applyReferenceEnv(&o, lookup)
	if err != nil {
		return o, warnings, secrets.ScrubErr(err, legacySecrets(o, lookup)...)
	}
	explicit, err := parseFlagsAndTwins(&o, args, lookup, usage)
	if err != nil {
		return o, warnings, err
	}
	if err := resolveMode(&o, explicit, asRef, lookup); err != nil {
		return o, warnings, o.AnnotateEnv(err)
	}
	if o.Reference {
		warnings = compat.ReferenceWarnings(warnings)
	}
	o.defaultLocalCache(explicit)
	if err := o.checkBackendChosen(explicit); err != nil {
		return o, warnings, o.AnnotateEnv(err)
	}
	if err := o.Validate(); err != nil {
		return o, warnings, o.AnnotateEnv(secrets.ScrubErr(err, Secrets(o)...))
	}
	if o.RedisSentinelAuthFile != "" {
		auth, err := secrets.ReadFile("redis-sentinel-auth-file", o.RedisSentinelAuthFile)
		if err != nil {
			return o, warnings, o.AnnotateEnv(err)
		}
		o.RedisSentinelAuth = auth
	}
	return o, warnings, nil
}

// legacySecrets are the credentials of o and of the reference's variables
// (compat.Secrets): none is quoted back in an error.
func legacySecrets(o Options, lookup func(string) (string, bool)) []string {
	return append(Secrets(o), compat.Secrets(lookup, redis.URLPassword)...)
}

// parseFlagsAndTwins sets o from the RATELIMITD_* twins, then from args
// (the flag wins), normalizes the spellings, and records in o.fromEnv the
// flags whose value came from a twin (dropping those an
// envoyproxy/ratelimit variable set that a twin or flag then replaced).
// It returns the flags set on the command line or by a twin; flag.ErrHelp
// (usage printed) for -h.
func parseFlagsAndTwins(o *Options, args []string, lookup func(string) (string, bool), usage io.Writer) (map[string]bool, error) {
	fs := flag.NewFlagSet("ratelimitd serve", flag.ContinueOnError)
	// The flag package prints a parse error and the whole usage itself;
	// the caller prints the error once with a short hint instead, and the
	// usage goes out only for -h.
	fs.SetOutput(io.Discard)
	lists := registerServeFlags(fs, o)
	durErr, restoreDurations := ClearDurationErrors(fs)
	fs.Usage = func() {}
	envValues, err := setTwins(fs, lists, lookup)
	if err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(usage, "Usage: ratelimitd serve [flags]\n\nEvery flag has an environment twin RATELIMITD_<FLAG> (the flag wins).\ndocs/flags.md documents each flag in full.\n\nFlags:\n")
			fs.SetOutput(usage)
			restoreDurations()
			fs.PrintDefaults()
		}
		if *durErr != nil {
			// "--redis-timeout=10: missing unit (e.g. 10ms or 10s)",
			// not the flag package's "parse error".
			err = *durErr
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve takes no arguments, got %q (use --config)", fs.Args())
	}
	o.normalizeSpellings()
	// A flag set on the command line or by its twin no longer holds an
	// envoyproxy/ratelimit variable's value (applyReferenceEnv).
	fs.Visit(func(f *flag.Flag) { delete(o.fromEnv, f.Name) })
	for name, v := range envValues {
		if fs.Lookup(name).Value.String() == v {
			if o.fromEnv == nil {
				o.fromEnv = map[string]string{}
			}
			o.fromEnv[name] = envName(name)
		}
	}
	explicit := map[string]bool{} // set on the command line or by a twin
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	return explicit, nil
}

// setTwins sets every flag of fs whose RATELIMITD_* twin is set, and
// returns each such flag's value as the twin set it (a list flag set by
// its twin is then replaced, not extended, by the command line). Every
// malformed twin is reported, as NAME="value": error.
func setTwins(fs *flag.FlagSet, lists []*listValue, lookup func(string) (string, bool)) (map[string]string, error) {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		if v, ok := lookup(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				if k := SecretKindOf(f.Name); k != secrets.None {
					v = secrets.Redact(k, v)
				}
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, l := range lists {
		l.touched = false
	}
	envValues := map[string]string{} // flag name → its value as set from the twin
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := lookup(envName(f.Name)); ok {
			envValues[f.Name] = f.Value.String()
		}
	})
	return envValues, nil
}

// normalizeSpellings lowers the case of --log-level (RATELIMITD_LOG_LEVEL=
// DEBUG; "warning" is warn) and --log-format, and reads
// --backend=memcached as memcache.
func (o *Options) normalizeSpellings() {
	o.LogLevel = strings.ToLower(strings.TrimSpace(o.LogLevel))
	if o.LogLevel == "warning" {
		o.LogLevel = "warn"
	}
	o.LogFormat = strings.ToLower(strings.TrimSpace(o.LogFormat))
	if o.Backend == "memcached" {
		o.Backend = "memcache"
	}
}

// checkBackendChosen refuses Redis or memcached flags given while the
// backend is the in-memory store by default: every replica would count
// alone (N replicas admit N times a limit) although the operator pointed
// ratelimitd at a shared store. explicit holds the flags set on the
// command line or by their twins; --backend=memory given explicitly keeps
// the memory store.
func (o Options) checkBackendChosen(explicit map[string]bool) error {
	if o.Backend != "memory" || explicit["backend"] {
		return nil
	}
	for _, c := range []struct{ flag, backend string }{
		{"redis-url", "redis"}, {"redis-mode", "redis"}, {"redis-addrs", "redis"}, {"redis-master", "redis"}, {"redis-password-file", "redis"},
		{"memcache-addrs", "memcache"}, {"memcache-srv", "memcache"},
	} {
		if explicit[c.flag] {
			return fmt.Errorf("--%s is set but the backend is the in-memory store (--backend defaults to memory): add --backend=%s, or --backend=memory to count in this process only", c.flag, c.backend)
		}
	}
	return nil
}

// ParseStatsdTags parses --statsd-tags ("k1:v1,k2:v2", as
// envoyproxy/ratelimit's EXTRA_TAGS is parsed: items split on ',', each
// split on ':' into exactly two parts, nothing trimmed, a later key
// replacing an earlier one). "" (or only spaces) is no tags.
func ParseStatsdTags(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	tags := make(map[string]string)
	for _, item := range strings.Split(s, ",") {
		kv := strings.Split(item, ":")
		if len(kv) != 2 {
			return nil, fmt.Errorf("--statsd-tags: item %q: want key:value", item)
		}
		tags[kv[0]] = kv[1]
	}
	return tags, nil
}

// defaultLocalCache turns the local over-limit cache off unless it was
// sized explicitly (--local-cache-size, its twin, or
// LOCAL_CACHE_SIZE_IN_BYTES) where it is not on by default: in reference
// mode (envoyproxy/ratelimit's default is off, and under its
// always_charge counting a cached key stops being charged, which a later
// refund would tell) and on memcached (which has no channel to learn of
// other replicas' refunds). On Redis in native mode the cache is exact
// (see redis.Options.CreditChannel) and on by default.
func (o *Options) defaultLocalCache(explicit map[string]bool) {
	if explicit["local-cache-size"] || o.refEnv.Has("local-cache-size") {
		return
	}
	if o.Reference || o.Backend != "redis" {
		o.Redis.LocalCacheSize = 0
	}
}

// List is a flag.Value holding a repeatable, comma-separated list in *p
// (as --config): the first Set replaces the value, later ones append.
func List(p *[]string) flag.Value { return &listValue{p: p} }
