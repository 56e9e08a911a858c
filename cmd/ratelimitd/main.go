// Command ratelimitd is a global rate-limit service for Envoy: it answers
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit from
// envoyproxy/ratelimit-compatible YAML configs, with an in-memory, Redis or
// memcached (fixed windows only) store.
//
//	ratelimitd serve    [flags]                      run the service
//	ratelimitd validate [--strict] [--explain] PATH... check config files/directories
//	ratelimitd replay   --config DIR --envoy FILE --log FILE [flags]
//	ratelimitd version
//	ratelimit [flags]                                  (as envoyproxy/ratelimit's binary: serve, reference mode)
//
// The command is wiring only: flags and environment become per-component
// Options (internal/serveopts), and server.go starts the servers.
// Flags use the standard library's flag package: three subcommands and one
// flag set do not justify a framework, and flag.VisitAll gives the
// RATELIMITD_* environment twins in a few lines.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// environ lists the process environment for the unknown RATELIMITD_*
// check (os.Environ; tests replace it).
var environ = os.Environ

// cgroupMemoryLimit reads the container's memory limit for the GC policy
// (memlimit.FromCgroup; tests replace it).
var cgroupMemoryLimit = memlimit.FromCgroup

// Set at build time: go build -ldflags "-X main.version=v1.2.3 -X main.commit=abc".
var (
	version = "dev"
	commit  = "dev"
)

const usageText = `ratelimitd: a global rate-limit service for Envoy (RLS v3).

Usage:
  ratelimitd serve    [flags]                          run the service (ratelimitd serve -h for flags)
  ratelimitd validate [--strict] [--explain] PATH...   check config files or directories; exit 0 ok, 1 invalid
  ratelimitd replay --config DIR --envoy FILE --log FILE [flags]
                                                       replay an access log through the decision path (docs/replay.md)
  ratelimitd version                                   print version, commit and Go version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := runAs(ctx, os.Args[0], os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runAs is run for a binary invoked as argv0. Invoked as ratelimit
// (envoyproxy/ratelimit's binary name, e.g. the image's /bin/ratelimit)
// with no subcommand, or with flags only, it serves as that binary does:
// `ratelimit` is `ratelimitd serve`, in reference mode unless a flag,
// RATELIMITD_MODE or RATELIMITD_CONFIG says otherwise.
func runAs(ctx context.Context, argv0 string, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	if compat.InvokedAsReference(argv0) && (len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0])) {
		return serveMain(ctx, true, args, lookup, stderr)
	}
	return run(ctx, args, lookup, stdout, stderr)
}

func isHelp(a string) bool {
	switch a {
	case "-h", "--help", "-help":
		return true
	}
	return false
}

// run executes one subcommand and returns the process exit code: 0 success,
// 1 failure (invalid config, server error), 2 usage error.
func run(ctx context.Context, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveMain(ctx, false, args[1:], lookup, stderr)
	case "validate":
		return validate(args[1:], lookup, stdout, stderr)
	case "replay":
		return replayMain(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "ratelimitd %s (commit %s, %s %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usageText)
		return 0
	}
	fmt.Fprintf(stderr, "ratelimitd: unknown command %q\n\n%s", args[0], usageText)
	return 2
}

// serveMain runs `serve` with args (asRef: invoked as ratelimit) and
// returns the exit code.
func serveMain(ctx context.Context, asRef bool, args []string, lookup func(string) (string, bool), stderr io.Writer) int {
	opts, warnings, err := serveopts.ParseAs(asRef, args, lookup, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimitd serve: %v\nRun 'ratelimitd serve -h' for the flags.\n", err)
		return 2
	}
	var set []string // the environment as lookup sees it
	for _, kv := range environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "" {
			if _, ok := lookup(name); ok {
				set = append(set, kv)
			}
		}
	}
	if w := serveopts.UnknownTwins(set); w != "" {
		warnings = append(warnings, w)
	}
	gc, err := serveopts.ChooseGC(opts, lookup, cgroupMemoryLimit, gcpolicy.Runtime)
	if err != nil {
		err = opts.AnnotateEnv(err)
		fmt.Fprintf(stderr, "ratelimitd serve: %v\n", err)
		return 2
	}
	if err := serve(ctx, opts, gc, warnings, stderr); err != nil {
		fmt.Fprintf(stderr, "ratelimitd serve: %v\n", err)
		return 1
	}
	return 0
}
