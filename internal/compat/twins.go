package compat

import (
	"fmt"
	"sort"
	"strings"
)

// Annotate returns err with every line that starts with a flag whose
// value came from the environment ("--gc-percent=-1: ...") followed by
// " (set by NAME)", NAME being setBy[flag]: its RATELIMITD_* twin or the
// reference variable that set it; nil stays nil.
func Annotate(err error, setBy map[string]string) error {
	if err == nil || len(setBy) == 0 {
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
		if v, ok := setBy[rest[:end]]; ok {
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

// UnknownTwins returns the one startup warning naming every RATELIMITD_*
// variable of environ ("NAME=value" entries, as os.Environ returns) that
// is not in twins, the serve flags' twins (a typo such as
// RATELIMITD_REDIS_ULR would otherwise be ignored silently), or "" when
// there is none.
func UnknownTwins(environ []string, twins map[string]bool) string {
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "RATELIMITD_") && !twins[name] && !nonFlagVariables[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	sort.Strings(unknown)
	return "RATELIMITD_* environment variables that match no serve flag (ignored; misspelled?): " + strings.Join(unknown, ", ")
}
