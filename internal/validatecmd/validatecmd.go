// Package validatecmd is `ratelimitd validate`: it loads config paths as
// serve would and reports every error and warning.
package validatecmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Env is what Run takes from serve: its environment and its defaults.
type Env struct {
	Lookup   func(string) (string, bool) // os.LookupEnv in production
	Defaults Defaults                    // serve's defaults
}

// Defaults are serve's defaults of the settings that shape a load.
type Defaults struct {
	MergeDomains   bool  // --merge-domains
	IgnoreDotfiles bool  // --ignore-dotfiles
	MaxConfigRules int   // --max-config-rules
	MaxConfigBytes int64 // --max-config-bytes
}

// Run implements `ratelimitd validate [--strict] [--explain] [PATH...]`:
// it loads the paths as serve would, prints every error (each starting with
// file:line) and every warning, and with --explain the compiled rules.
// Exit 0 valid, 1 invalid (or warnings with --strict), 2 usage error.
// The settings that shape the load (--merge-domains, --ignore-dotfiles,
// --backend, the mode, and their twins and envoyproxy/ratelimit variables)
// apply as they do for serve; in reference mode with no PATH it loads the
// directory serve would.
func Run(args []string, env Env, stdout, stderr io.Writer) int {
	lookup := env.Lookup
	fs := flag.NewFlagSet("ratelimitd validate", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once below, usage only for -h
	strict := fs.Bool("strict", false, "treat warnings as errors")
	explain := fs.Bool("explain", false, "print the compiled rules")
	// The defaults and environment of serve: serve's own defaults, its
	// RATELIMITD_* twins, then envoyproxy/ratelimit's variables.
	def := env.Defaults
	mergeDefault, err1 := envBool(lookup, def.MergeDomains, "RATELIMITD_MERGE_DOMAINS", "MERGE_DOMAIN_CONFIG")
	dotDefault, err2 := envBool(lookup, def.IgnoreDotfiles, "RATELIMITD_IGNORE_DOTFILES", "RUNTIME_IGNOREDOTFILES")
	rulesDefault, err3 := envInt(lookup, int64(def.MaxConfigRules), "RATELIMITD_MAX_CONFIG_RULES")
	bytesDefault, err4 := envInt(lookup, def.MaxConfigBytes, "RATELIMITD_MAX_CONFIG_BYTES")
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		fmt.Fprintf(stderr, "ratelimitd validate: %v\n", err)
		return 2
	}
	merge := fs.Bool("merge-domains", mergeDefault, "let several files contribute to one domain")
	backend := fs.String("backend", envBackend(lookup), "check the config against this backend's algorithms: memory, redis or memcache")
	_, durableSet := lookup("RATELIMITD_DURABLE_URL")
	durable := fs.Bool("durable", durableSet, "check the config as serve with --durable-url does: limits with store: durable load (fixed_window or sliding_window, windows of an hour or longer); default true when RATELIMITD_DURABLE_URL is set")
	maxRules := fs.Int("max-config-rules", int(rulesDefault), "most rules the config may hold, as serve enforces it (0 = no limit)")
	maxBytes := fs.Int64("max-config-bytes", bytesDefault, "most bytes the config files may hold together, as serve enforces it (0 = no limit)")
	dot := fs.Bool("ignore-dotfiles", dotDefault, "skip config files and directories whose name starts with a dot (Kubernetes ConfigMap ..data); --ignore-dotfiles=false loads them (reference mode's default unless RUNTIME_IGNOREDOTFILES=true)")
	modeDefault := compat.ModeAuto
	if v, ok := lookup("RATELIMITD_MODE"); ok {
		modeDefault = strings.TrimSpace(v)
	}
	var configs configList
	fs.Var(&configs, "config", "a config file or directory, as serve's --config (repeatable, or comma-separated); the same as naming it as a PATH")
	mode := fs.String("mode", modeDefault, "auto, reference or native, as serve resolves it; reference mode loads as envoyproxy/ratelimit does (with no PATH its config directory, dot files unless RUNTIME_IGNOREDOTFILES=true, a file named twice loaded twice)")
	printUsage := func() {
		fmt.Fprintf(stderr, "Usage: ratelimitd validate [--strict] [--explain] PATH...\n       ratelimitd validate [flags]   (reference mode: the directory serve loads)\n\nExit status: 0 valid, 1 invalid, 2 usage error.\n\nFlags:\n")
		fs.SetOutput(stderr)
		fs.PrintDefaults()
	}
	fs.Usage = func() {}
	ordered, err := interleave(fs, args)
	if err == nil {
		err = fs.Parse(ordered)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage()
			return 0
		}
		fmt.Fprintf(stderr, "ratelimitd validate: %v\nRun 'ratelimitd validate -h' for the flags.\n", err)
		return 2
	}
	ref, reason, err := compat.ValidateMode(*mode, lookup)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimitd validate: %v\n", err)
		return 2
	}
	paths := append([]string(configs), fs.Args()...)
	lo := policy.LoadOptions{MergeDomains: *merge, IgnoreDotFiles: *dot, MaxRules: *maxRules, MaxBytes: *maxBytes}
	if *durable {
		lo.Durable = policy.DurableOptions{Enabled: true, Algorithms: postgres.SupportedAlgorithms()}
	}
	if ref {
		dotSet := false
		fs.Visit(func(f *flag.Flag) { dotSet = dotSet || f.Name == "ignore-dotfiles" })
		if _, ok := lookup("RATELIMITD_IGNORE_DOTFILES"); ok {
			dotSet = true
		}
		if v, ok := lookup("RUNTIME_IGNOREDOTFILES"); ok && strings.TrimSpace(v) != "" {
			dotSet = true
		}
		lo.IgnoreDotFiles = compat.IgnoreDotfiles(*dot, dotSet)
		lo.RepeatPaths = true
		lo.LiteralValues = true
		if len(paths) == 0 {
			if paths, err = compat.ConfigPaths(lookup); err != nil {
				fmt.Fprintf(stderr, "ratelimitd validate: %v\n", err)
				return 2
			}
		}
		fmt.Fprintf(stderr, "reference mode (%s): loading %s as envoyproxy/ratelimit does (dot files %s, a file named twice loaded twice)\n",
			reason, strings.Join(paths, ", "), map[bool]string{true: "skipped", false: "loaded"}[lo.IgnoreDotFiles])
	}
	if len(paths) == 0 {
		printUsage()
		return 2
	}
	switch b := strings.ToLower(strings.TrimSpace(*backend)); b {
	case "", "memory", "redis":
	case "memcache", "memcached":
		lo.Algorithms, lo.Backend = memcache.SupportedAlgorithms(), "memcache"
		lo.NoPenalty = true // memcache.Store.PenaltyBoxes
	default:
		fmt.Fprintf(stderr, "ratelimitd validate: --backend=%q: want one of memory, redis, memcache\n", *backend)
		return 2
	}
	set, warnings, err := policy.Load(lo, paths...)
	for _, w := range warnings {
		fmt.Fprintln(stdout, w.String())
	}
	if err != nil {
		n := 0
		for _, line := range strings.Split(strings.TrimRight(err.Error(), "\n"), "\n") {
			if line != "" {
				fmt.Fprintln(stdout, line)
				n++
			}
		}
		fmt.Fprintf(stderr, "invalid: %d error(s), %d warning(s)\n", n, len(warnings))
		return 1
	}
	if *explain && set != nil {
		if err := set.WriteExplain(stdout); err != nil {
			fmt.Fprintf(stderr, "explain: %v\n", err)
			return 1
		}
	}
	if *strict && len(warnings) > 0 {
		fmt.Fprintf(stderr, "invalid (--strict): %d warning(s)\n", len(warnings))
		return 1
	}
	fmt.Fprintf(stderr, "ok: %d domain(s), %d rule(s), %d warning(s)\n", len(set.Domains()), len(set.Rules()), len(warnings))
	return 0
}

// interleave lets flags follow paths (`validate dir --strict`): the flag
// package stops at the first non-flag argument. It reads the arguments as
// the flag package would: a flag of fs that is not boolean, given without
// "=", takes the next argument as its value (`--backend memcache`); a
// boolean flag takes a value only as --flag=value. A boolean flag followed
// by a word strconv.ParseBool reads (`--ignore-dotfiles false`) is an
// error, since that word would otherwise be loaded as a path.
func interleave(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, paths []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			paths = append(paths, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || len(a) == 1 {
			paths = append(paths, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // fs.Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			if i+1 < len(args) {
				if _, err := strconv.ParseBool(args[i+1]); err == nil {
					return nil, fmt.Errorf("%s %s: a boolean flag takes its value as %s=%s", a, args[i+1], a, args[i+1])
				}
			}
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return append(append(flags, "--"), paths...), nil
}

// envBackend is the backend serve would use from the environment:
// RATELIMITD_BACKEND, else BACKEND_TYPE ("" when neither is set).
func envBackend(lookup func(string) (string, bool)) string {
	for _, n := range []string{"RATELIMITD_BACKEND", "BACKEND_TYPE"} {
		if v, ok := lookup(n); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// envBool reads the first set variable of names as a bool
// (strconv.ParseBool: 1, t, true, 0, f, false, any case), or returns def
// when none is set. A malformed value is an error naming the variable,
// as serve refuses it.
func envBool(lookup func(string) (string, bool), def bool, names ...string) (bool, error) {
	for _, n := range names {
		if v, ok := lookup(n); ok {
			v = strings.TrimSpace(v)
			if v == "" && !strings.HasPrefix(n, "RATELIMITD_") {
				continue // serve skips an empty envoyproxy/ratelimit variable
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return def, fmt.Errorf("%s=%q: %w", n, v, err)
			}
			return b, nil
		}
	}
	return def, nil
}

// envInt is the value of the first set variable of names as an integer,
// else def.
func envInt(lookup func(string) (string, bool), def int64, names ...string) (int64, error) {
	for _, n := range names {
		if v, ok := lookup(n); ok {
			i, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return def, fmt.Errorf("%s=%q: %w", n, v, err)
			}
			return i, nil
		}
	}
	return def, nil
}

// configList is --config: paths, repeatable or comma-separated.
type configList []string

func (c *configList) String() string { return strings.Join(*c, ",") }

func (c *configList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*c = append(*c, p)
		}
	}
	return nil
}
