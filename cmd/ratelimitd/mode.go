package main

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
// default reference mode changes. docs/migrating.md describes the rule.

// Values of --mode.
const (
	modeAuto      = "auto"
	modeReference = "reference"
	modeNative    = "native"
)

// referenceBinaryName is the name envoyproxy/ratelimit's image gives its
// binary (/bin/ratelimit): invoked under that name without a subcommand,
// ratelimitd serves as that binary does.
const referenceBinaryName = "ratelimit"

// referenceTriggers are the envoyproxy/ratelimit variables that select
// where its config comes from, its backend or what a client sees; any of
// them set selects reference mode under --mode=auto. Names that are
// common outside that project (HOST, PORT, LOG_LEVEL, GRPC_PORT, ...) are
// deliberately not among them: they are mapped, but do not switch modes.
var referenceTriggers = []string{
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES",
	"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL",
	"BACKEND_TYPE", "REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "MEMCACHE_HOST_PORT", "MEMCACHE_SRV",
	"USE_STATSD", "USE_PROMETHEUS",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
}

// envoyproxy/ratelimit's defaults that reference mode applies.
const (
	referenceConfigDir = "/srv/runtime_data/current/config" // RUNTIME_ROOT/RUNTIME_APPDIRECTORY defaults
	// referenceMemcacheTimeout is gomemcache's DefaultTimeout, which the
	// reference's memcache client keeps (socket and connect timeout).
	referenceMemcacheTimeout = 500 * time.Millisecond
	referenceLimitHeader     = "RateLimit-Limit"     // LIMIT_LIMIT_HEADER default
	referenceRemainingHdr    = "RateLimit-Remaining" // LIMIT_REMAINING_HEADER default
	referenceResetHeader     = "RateLimit-Reset"     // LIMIT_RESET_HEADER default
	referenceModeLogMessage  = "reference mode: Envoy and clients get envoyproxy/ratelimit's answers (headers, bodies, counting); ratelimitd's own flags still win"
	nativeModeLogMessage     = "native mode: ratelimitd's own defaults"
)

// legacySeen records which envoyproxy/ratelimit variables applyLegacyEnv
// found set, for the reference-mode defaults that depend on them.
type legacySeen struct {
	configDir   bool // RUNTIME_ROOT, RUNTIME_SUBDIRECTORY or RUNTIME_APPDIRECTORY
	backend     bool // BACKEND_TYPE, REDIS_URL or REDIS_TYPE
	headersFlag bool // LIMIT_RESPONSE_HEADERS_ENABLED
	limitName   bool // LIMIT_LIMIT_HEADER
	remainName  bool // LIMIT_REMAINING_HEADER
	resetName   bool // LIMIT_RESET_HEADER
	localCache  bool // LOCAL_CACHE_SIZE_IN_BYTES
}

// referenceVarsSet returns the referenceTriggers that are set, in
// their order.
func referenceVarsSet(lookup func(string) (string, bool)) []string {
	var set []string
	for _, n := range referenceTriggers {
		if _, ok := lookup(n); ok {
			set = append(set, n)
		}
	}
	return set
}

// invokedAsReference reports whether argv0 is envoyproxy/ratelimit's
// binary name (a symlink or copy named ratelimit).
func invokedAsReference(argv0 string) bool {
	return filepath.Base(argv0) == referenceBinaryName
}

// resolveMode decides the mode in force from --mode (RATELIMITD_MODE), the
// flags given (explicit: flag names set on the command line or by their
// twin), the binary name and the environment, and applies the
// reference-mode defaults. The rule, under --mode=auto:
//
//  1. --config or --config-source (or their twins) given: native,
//     ratelimitd's own config is in use;
//  2. invoked as ratelimit (asRef): reference;
//  3. any of referenceTriggers set: reference;
//  4. otherwise native.
//
// --mode=reference and --mode=native force the mode.
func resolveMode(o *Options, explicit map[string]bool, asRef bool, lookup func(string) (string, bool)) error {
	from := "--mode"
	if v, ok := o.fromEnv["mode"]; ok {
		from = v
	}
	switch o.Mode {
	case modeReference:
		o.Reference, o.modeReason = true, from+"=reference"
	case modeNative:
		o.Reference, o.modeReason = false, from+"=native"
	case modeAuto:
		set := referenceVarsSet(lookup)
		switch {
		case explicit["config"] || explicit["config-source"]:
			o.modeReason = "--config or --config-source (or their RATELIMITD_* twins) given"
			if len(set) > 0 {
				o.modeReason += " (outranks " + strings.Join(set, ", ") + ")"
			}
		case asRef:
			o.Reference, o.modeReason = true, "invoked as "+referenceBinaryName+", envoyproxy/ratelimit's binary name"
		case len(set) > 0:
			o.Reference, o.modeReason = true, "envoyproxy/ratelimit variables set: "+strings.Join(set, ", ")
		default:
			o.modeReason = "no envoyproxy/ratelimit variable set"
		}
	default:
		return fmt.Errorf("--mode=%q: want one of auto, reference, native", o.Mode)
	}
	if o.Reference {
		return o.applyReferenceDefaults(explicit, lookup)
	}
	return nil
}

// applyReferenceDefaults sets envoyproxy/ratelimit's defaults on every
// client-visible setting that neither a flag nor a RATELIMITD_* twin (nor
// the reference variable mapped onto it) set:
//
//   - no rate-limit headers unless LIMIT_RESPONSE_HEADERS_ENABLED=true,
//     which gives the three legacy headers under LIMIT_LIMIT_HEADER,
//     LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER (defaults
//     RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset);
//   - no Retry-After and no RFC 9457 body on OVER_LIMIT;
//   - requests accepted and refused, and denied limits' limit_remaining
//     reported, as the reference does (service.Options.ReferenceAnswers);
//   - counting as the reference counts: --counting=always_charge, or
//     all_or_nothing with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true;
//   - statsd sent as the reference sends it (useReferenceStatsd);
//   - --memcache-timeout 500ms (gomemcache's default, which the
//     reference's memcache client keeps);
//   - the config directory /srv/runtime_data/current/config and a Redis
//     backend at /var/run/nutcracker/ratelimit.sock when no variable
//     names them (the reference's defaults);
//   - config files loaded as the reference loads them: dot files and
//     directories too unless RUNTIME_IGNOREDOTFILES=true (its default is
//     false), and a file as often as the config paths name it
//     (policy.LoadOptions.RepeatPaths, set in newConfigSource).
func (o *Options) applyReferenceDefaults(explicit map[string]bool, lookup func(string) (string, bool)) error {
	seen := o.legacySeen
	if !explicit["headers"] && !seen.headersFlag {
		o.Headers = "none"
	}
	for _, h := range []struct {
		flag string
		seen bool
		dst  *string
		def  string
	}{
		{"legacy-limit-header", seen.limitName, &o.LegacyLimitHeader, referenceLimitHeader},
		{"legacy-remaining-header", seen.remainName, &o.LegacyRemainingHeader, referenceRemainingHdr},
		{"legacy-reset-header", seen.resetName, &o.LegacyResetHeader, referenceResetHeader},
	} {
		if !explicit[h.flag] && !h.seen {
			*h.dst = h.def
		}
	}
	if !explicit["problem-body"] {
		o.ProblemBody = false
	}
	// statsd as the reference sends it: with USE_STATSD unset (its
	// default is true), to STATSD_HOST:STATSD_PORT.
	if !explicit["statsd-addr"] {
		o.useReferenceStatsd()
	}
	o.ReferenceAnswers = true
	// The reference's counting, unless --counting (or its twin) says
	// otherwise: every hit of every request is charged (always_charge).
	// With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true the reference
	// charges nothing to the other limits of a request one of whose
	// limits goes over: all_or_nothing is that, except that the reference
	// still charges the limit that goes over.
	o.ReferenceCounting = true
	if !explicit["counting"] {
		o.Counting = "always_charge"
		if o.StopIncrementWhenOverLimit {
			o.Counting = "all_or_nothing"
		}
	}
	if !explicit["config"] && !seen.configDir {
		o.Config = []string{referenceConfigDir}
	}
	o.IgnoreDotfiles = referenceIgnoreDotfiles(o.IgnoreDotfiles, explicit["ignore-dotfiles"] || o.fromEnv["ignore-dotfiles"] != "")
	// The reference's memcache client keeps gomemcache's default timeout.
	if !explicit["memcache-timeout"] {
		o.Memcache.Timeout = referenceMemcacheTimeout
	}
	if !explicit["backend"] && !seen.backend {
		o.Backend = "redis"
		if !explicit["redis-url"] && !explicit["redis-mode"] {
			if err := legacyRedis(o, "", "", false, lookup); err != nil {
				return err
			}
		}
	}
	return nil
}

// referenceIgnoreDotfiles is --ignore-dotfiles in reference mode: set
// (by the flag, its twin or RUNTIME_IGNOREDOTFILES) it is v, else the
// reference's default, false. A Kubernetes ConfigMap volume then loads
// every file twice (its ..<timestamp> directory), a duplicate domain or
// key, exactly as the reference refuses it.
func referenceIgnoreDotfiles(v, set bool) bool {
	return set && v
}

// modeLog returns the startup log message and attributes that say which
// mode is in force and why.
func (o Options) modeLog() (string, []any) {
	mode, msg := modeNative, nativeModeLogMessage
	if o.Reference {
		mode, msg = modeReference, referenceModeLogMessage
	}
	return msg, []any{"mode", mode, "reason", o.modeReason}
}

// referenceWarnings drops from the startup warnings what reference mode
// honours after all: STATSD_HOST and STATSD_PORT without USE_STATSD
// (statsd is sent there, as the reference sends it). A warning left with
// no variable is dropped.
func referenceWarnings(ws []string) []string {
	var out []string
	for _, w := range ws {
		rest, ok := strings.CutPrefix(w, legacyUnsupportedWarning)
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
			out = append(out, legacyUnsupportedWarning+strings.Join(keep, ", "))
		}
	}
	return out
}
