package compat

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Reference mode: a deployment configured as envoyproxy/ratelimit is (its
// environment variables, or its binary name) gets that project's answers
// by default: what Envoy and clients see is what the reference would send.
// ratelimitd's own flags and RATELIMITD_* twins still win over every
// default reference mode changes.

// Values of --mode.
const (
	ModeAuto      = "auto"
	ModeReference = "reference"
	ModeNative    = "native"
)

// binaryName is the name the reference's image gives its binary
// (/bin/ratelimit): invoked under that name without a subcommand,
// ratelimitd serves as that binary does.
const binaryName = "ratelimit"

// triggers are the reference's variables that select where its config
// comes from, its backend or what a client sees; any of them set selects
// reference mode under --mode=auto. Names that are common outside that
// project (HOST, PORT, LOG_LEVEL, GRPC_PORT, ...) are deliberately not
// among them: they are mapped, but do not switch modes.
var triggers = []string{
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES",
	"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL",
	"BACKEND_TYPE", "REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "MEMCACHE_HOST_PORT", "MEMCACHE_SRV",
	"USE_STATSD", "USE_PROMETHEUS",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
}

// The reference's defaults that reference mode applies.
const (
	// ReferenceConfigDir is the reference's config directory when no
	// RUNTIME_* variable names one.
	ReferenceConfigDir = "/srv/runtime_data/current/config"
	// memcacheTimeout is gomemcache's DefaultTimeout, which the
	// reference's memcache client keeps (socket and connect timeout).
	memcacheTimeout         = 500 * time.Millisecond
	referenceModeLogMessage = "reference mode: Envoy and clients get envoyproxy/ratelimit's answers (headers, bodies, counting); ratelimitd's own flags still win"
	nativeModeLogMessage    = "native mode: ratelimitd's own defaults"
)

// TriggersSet returns the reference variables that select reference mode
// and are set, in their order.
func TriggersSet(lookup func(string) (string, bool)) []string {
	var set []string
	for _, n := range triggers {
		if _, ok := lookup(n); ok {
			set = append(set, n)
		}
	}
	return set
}

// InvokedAsReference reports whether argv0 is the reference's binary name
// (a symlink or copy named ratelimit).
func InvokedAsReference(argv0 string) bool {
	return filepath.Base(argv0) == binaryName
}

// ModeInput is what Resolve decides from.
type ModeInput struct {
	// Mode is --mode: ModeAuto, ModeReference or ModeNative.
	Mode string
	// From names where Mode came from when not the command line
	// ("RATELIMITD_MODE"); "" is --mode.
	From string
	// Explicit holds the flags set on the command line or by their
	// RATELIMITD_* twins.
	Explicit map[string]bool
	// AsRef says the binary was invoked as ratelimit.
	AsRef bool
	// Env is ReadEnv's reading of the environment.
	Env Env
	// Lookup reads an environment variable (os.LookupEnv).
	Lookup func(string) (string, bool)
}

// Mode is the mode in force, why, and the flag assignments reference
// mode makes.
type Mode struct {
	// Reference is true in reference mode, false in native mode.
	Reference bool
	// Reason says why, for the startup log line.
	Reason string
	// Defaults are the reference's defaults of the flags no flag, twin or
	// reference variable set; serve applies them after its flags.
	Defaults []Set
}

// Resolve decides the mode in force. The rule, under --mode=auto:
//
//  1. --config or --config-source (or their twins) given: native,
//     ratelimitd's own config is in use;
//  2. invoked as ratelimit: reference;
//  3. any of the trigger variables set: reference;
//  4. otherwise native.
//
// --mode=reference and --mode=native force the mode.
func Resolve(in ModeInput) (Mode, error) {
	from := "--mode"
	if in.From != "" {
		from = in.From
	}
	var m Mode
	switch in.Mode {
	case ModeReference:
		m = Mode{Reference: true, Reason: from + "=reference"}
	case ModeNative:
		m = Mode{Reason: from + "=native"}
	case ModeAuto:
		set := TriggersSet(in.Lookup)
		switch {
		case in.Explicit["config"] || in.Explicit["config-source"]:
			m.Reason = "--config or --config-source (or their RATELIMITD_* twins) given"
			if len(set) > 0 {
				m.Reason += " (outranks " + strings.Join(set, ", ") + ")"
			}
		case in.AsRef:
			m = Mode{Reference: true, Reason: "invoked as " + binaryName + ", envoyproxy/ratelimit's binary name"}
		case len(set) > 0:
			m = Mode{Reference: true, Reason: "envoyproxy/ratelimit variables set: " + strings.Join(set, ", ")}
		default:
			m.Reason = "no envoyproxy/ratelimit variable set"
		}
	default:
		return Mode{}, fmt.Errorf("--mode=%q: want one of auto, reference, native", in.Mode)
	}
	if !m.Reference {
		return m, nil
	}
	var err error
	m.Defaults, err = referenceDefaults(in)
	return m, err
}

// referenceDefaults are the reference's defaults of every client-visible
// setting that no flag, RATELIMITD_* twin or mapped reference variable
// set: its headers, no Retry-After or problem body, its counting, its
// statsd address, memcache timeout, config directory, Redis socket and
// dot-file handling (docs/migrating.md lists them). The answers and the
// counting themselves are serve's to switch.
func referenceDefaults(in ModeInput) ([]Set, error) {
	var d []Set
	unset := func(flag string) bool { return !in.Explicit[flag] && !in.Env.Has(flag) }
	if unset("headers") {
		d = append(d, Set{"headers", "none"})
	}
	for _, h := range []Set{
		{"legacy-limit-header", "RateLimit-Limit"},
		{"legacy-remaining-header", "RateLimit-Remaining"},
		{"legacy-reset-header", "RateLimit-Reset"},
	} {
		if unset(h.Flag) {
			d = append(d, h)
		}
	}
	if !in.Explicit["problem-body"] {
		d = append(d, Set{"problem-body", "false"})
	}
	// statsd as the reference sends it: with USE_STATSD unset (its
	// default is true), to STATSD_HOST:STATSD_PORT.
	if unset("statsd-addr") && in.Env.StatsdReferenceAddr != "" {
		d = append(d, Set{"statsd-addr", in.Env.StatsdReferenceAddr})
	}
	// The reference's counting: every hit of every request is charged
	// (always_charge). With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true
	// the reference charges nothing to the other limits of a request one
	// of whose limits goes over: all_or_nothing is that, except that the
	// reference still charges the limit that goes over.
	if !in.Explicit["counting"] {
		counting := "always_charge"
		if in.Env.StopIncrementWhenOverLimit {
			counting = "all_or_nothing"
		}
		d = append(d, Set{"counting", counting})
	}
	if unset("config") {
		d = append(d, Set{"config", ReferenceConfigDir})
	}
	if unset("ignore-dotfiles") {
		d = append(d, Set{"ignore-dotfiles", "false"})
	}
	if !in.Explicit["memcache-timeout"] {
		d = append(d, Set{"memcache-timeout", memcacheTimeout.String()})
	}
	if unset("backend") {
		d = append(d, Set{"backend", "redis"})
		if !in.Explicit["redis-url"] && !in.Explicit["redis-mode"] {
			sets, err := redisSets("", "", false, in.Lookup)
			if err != nil {
				return nil, err
			}
			d = append(d, sets...)
		}
	}
	return d, nil
}

// IgnoreDotfiles is --ignore-dotfiles in reference mode: set (by the
// flag, its twin or RUNTIME_IGNOREDOTFILES) it is v, else the reference's
// default, false. A Kubernetes ConfigMap volume then loads every file
// twice (its ..<timestamp> directory), a duplicate domain or key, exactly
// as the reference refuses it.
func IgnoreDotfiles(v, set bool) bool {
	return set && v
}

// Log returns the startup log message and attributes that say which mode
// is in force and why.
func (m Mode) Log() (string, []any) {
	mode, msg := ModeNative, nativeModeLogMessage
	if m.Reference {
		mode, msg = ModeReference, referenceModeLogMessage
	}
	return msg, []any{"mode", mode, "reason", m.Reason}
}

// ReferenceWarnings drops from the startup warnings what reference mode
// honours after all: STATSD_HOST and STATSD_PORT without USE_STATSD
// (statsd is sent there, as the reference sends it). A warning left with
// no variable is dropped.
func ReferenceWarnings(ws []string) []string {
	var out []string
	for _, w := range ws {
		rest, ok := strings.CutPrefix(w, unsupportedWarning)
		if !ok {
			out = append(out, w)
			continue
		}
		var keep []string
		for _, n := range strings.Split(rest, ", ") {
			if !strings.HasSuffix(n, statsdOnlyWithUse) {
				keep = append(keep, n)
			}
		}
		if len(keep) > 0 {
			out = append(out, unsupportedWarning+strings.Join(keep, ", "))
		}
	}
	return out
}
