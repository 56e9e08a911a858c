// The reference's environment and reference mode (internal/compat)
// applied to Options.

package serveopts

import (
	"flag"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compat"
)

// applyReferenceEnv sets o from envoyproxy/ratelimit's variables (below
// the twins and flags, which parseFlagsAndTwins applies next) and keeps
// the reading for resolveMode. It returns the startup warnings.
func applyReferenceEnv(o *Options, lookup func(string) (string, bool)) ([]string, error) {
	fs := flag.NewFlagSet("reference environment", flag.ContinueOnError)
	registerServeFlags(fs, o)
	env, err := compat.ReadEnv(lookup, legacyTable(), func(name string) string { return fs.Lookup(name).Value.String() })
	if serr := setFlags(fs, env.Sets); err == nil {
		err = serr
	}
	// fromEnv changes as twins and flags replace values; refEnv keeps
	// the reading.
	o.refEnv, o.fromEnv = env, maps.Clone(env.SetBy)
	o.StatsdReferenceAddr = env.StatsdReferenceAddr
	o.StopIncrementWhenOverLimit = env.StopIncrementWhenOverLimit
	return env.Warnings, err
}

// resolveMode decides the mode in force (compat.Resolve) from --mode, the
// flags set on the command line or by their twins (explicit), the binary
// name (asRef) and the environment, and applies the reference's defaults.
func resolveMode(o *Options, explicit map[string]bool, asRef bool, lookup func(string) (string, bool)) error {
	m, err := compat.Resolve(compat.ModeInput{Mode: o.Mode, From: o.fromEnv["mode"], Explicit: explicit, AsRef: asRef, Env: o.refEnv, Lookup: lookup})
	if err != nil {
		return err
	}
	o.Reference, o.modeReason = m.Reference, m.Reason
	o.ReferenceAnswers, o.ReferenceCounting = m.Reference, m.Reference
	fs := flag.NewFlagSet("reference mode", flag.ContinueOnError)
	registerServeFlags(fs, o)
	return setFlags(fs, m.Defaults)
}

// setFlags applies compat's flag assignments to fs.
func setFlags(fs *flag.FlagSet, sets []compat.Set) error {
	for _, s := range sets {
		if err := fs.Set(s.Flag, s.Value); err != nil {
			return fmt.Errorf("--%s: %w", s.Flag, err)
		}
	}
	return nil
}

// ModeLog returns the startup log line saying which mode is in force and
// why.
func (o Options) ModeLog() (string, []any) {
	return compat.Mode{Reference: o.Reference, Reason: o.modeReason}.Log()
}

// AnnotateEnv names, after each line of err about a flag set from the
// environment, the variable that set it (compat.Annotate).
func (o Options) AnnotateEnv(err error) error {
	return compat.Annotate(err, o.fromEnv)
}

// UnknownTwins is the startup warning naming the RATELIMITD_* variables
// of environ that are the twin of no serve flag (compat.UnknownTwins).
func UnknownTwins(environ []string) string {
	o := Defaults()
	fs := flag.NewFlagSet("twins", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	twins := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { twins[envName(f.Name)] = true })
	return compat.UnknownTwins(environ, twins)
}

// legacyTable lists the settings' plain envoyproxy/ratelimit variables,
// each parsed as the reference parses it (setLegacy) into its flag's
// value.
func legacyTable() []compat.Plain {
	var t []compat.Plain
	for _, s := range settings {
		for _, name := range s.legacy {
			t = append(t, compat.Plain{Var: name, Flag: s.name, Parse: func(v string) (string, error) {
				var o Options
				p := s.field.ptr(&o)
				if err := setLegacy(p, v); err != nil {
					return "", err
				}
				return flagValue(p), nil
			}})
		}
	}
	return t
}

// flagValue is the value of the field p points to as its flag parses it.
func flagValue(p any) string {
	switch p := p.(type) {
	case *bool:
		return strconv.FormatBool(*p)
	case *int:
		return strconv.Itoa(*p)
	case *float64:
		return strconv.FormatFloat(*p, 'g', -1, 64)
	case *time.Duration:
		return p.String()
	case *[]string:
		return strings.Join(*p, ",")
	case *string:
		return *p
	}
	panic(fmt.Sprintf("flagValue: unsupported field type %T", p))
}

// splitList splits a comma-separated list, trimming and dropping empty
// items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
