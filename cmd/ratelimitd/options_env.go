// Naming the environment variable behind a bad value, and warning of
// RATELIMITD_* variables that match no flag.

package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// annotateEnv returns err with every line that starts with a flag whose
// value came from the environment ("--gc-percent=-1: ...") followed by
// " (set by RATELIMITD_GC_PERCENT)", or the envoyproxy/ratelimit variable
// that set it (" (set by NEAR_LIMIT_RATIO)"); nil stays nil.
func (o Options) annotateEnv(err error) error {
	if err == nil || len(o.fromEnv) == 0 {
		return err
	}
	lines := strings.Split(err.Error(), "\n")
	changed := false
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "--")
		if !ok {
			continue
		}
		end := strings.IndexFunc(rest, func(r rune) bool { return r != '-' && (r < 'a' || r > 'z') && (r < '0' || r > '9') })
		if end < 0 {
			end = len(rest)
		}
		if v, ok := o.fromEnv[rest[:end]]; ok {
			lines[i] = l + " (set by " + v + ")"
			changed = true
		}
	}
	if !changed {
		return err
	}
	return fmt.Errorf("%s", strings.Join(lines, "\n"))
}

// nonFlagVariables are RATELIMITD_* variables read by the project's tests
// and scripts, not by `serve`; they are not reported as unknown.
var nonFlagVariables = map[string]bool{
	"RATELIMITD_REQUIRE_REDIS":           true,
	"RATELIMITD_LONG":                    true,
	"RATELIMITD_SERVICE_REFERENCE_STORE": true,
	"RATELIMITD_BENCH_TIMEOUT":           true,
	"RATELIMITD_BENCH_POOL":              true,
}

// unknownTwins returns the one startup warning naming every RATELIMITD_*
// variable of environ ("NAME=value" entries, as os.Environ returns) that is
// the twin of no serve flag (a typo such as RATELIMITD_REDIS_ULR would
// otherwise be ignored silently), or "" when there is none.
func unknownTwins(environ []string) string {
	o := defaultOptions()
	fs := flag.NewFlagSet("twins", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "RATELIMITD_") && !known[name] && !nonFlagVariables[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	sort.Strings(unknown)
	return "RATELIMITD_* environment variables that match no serve flag (ignored; misspelled?): " + strings.Join(unknown, ", ")
}
