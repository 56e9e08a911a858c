package serveopts

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseDuration is time.ParseDuration ("10ms", "1.5s", "1h30m") with
// errors that say what to write instead: a bare number such as "10" is
// "missing unit (e.g. 10ms or 10s)", anything else "not a duration
// (e.g. ...)". "0" needs no unit. The error does not repeat the value;
// callers prefix the flag or variable and its value.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, ferr := strconv.ParseFloat(s, 64); ferr == nil {
		return 0, fmt.Errorf("missing unit (e.g. %sms or %ss)", s, s)
	}
	return 0, errors.New("not a duration (e.g. 10ms, 1.5s, 2m, 1h30m)")
}

// durationValue wraps the flag package's own time.Duration value so that
// a malformed value is refused with parseDuration's error (the flag
// package only says "parse error"). The first such error of a parse is
// also kept in *failed as "--NAME=VALUE: error", the message the command
// prints (as an environment variable's error is "NAME=VALUE: error").
type durationValue struct {
	flag.Getter
	name   string
	failed *error
}

func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		if *v.failed == nil {
			*v.failed = fmt.Errorf("--%s=%s: %w", v.name, s, err)
		}
		return err
	}
	return v.Getter.Set(d.String())
}

// ClearDurationErrors wraps every time.Duration flag of fs (registered
// with fs.DurationVar) in a durationValue. failed holds the first
// malformed duration's "--NAME=VALUE: error" once a parse failed on one
// (nil otherwise); restore puts the flag package's values back, for
// PrintDefaults, which names their type ("duration") only on its own
// values.
func ClearDurationErrors(fs *flag.FlagSet) (failed *error, restore func()) {
	failed = new(error)
	orig := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		if _, ok := g.Get().(time.Duration); !ok {
			return
		}
		orig[f] = f.Value
		f.Value = &durationValue{Getter: g, name: f.Name, failed: failed}
	})
	return failed, func() {
		for f, v := range orig {
			f.Value = v
		}
	}
}
