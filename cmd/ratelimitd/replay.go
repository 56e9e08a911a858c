package main

// `ratelimitd replay`: its flags. internal/replaycmd runs it, on pkg/replay.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/replaycmd"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
)

const replayUsage = `Usage: ratelimitd replay --config DIR --envoy FILE.yaml --log FILE [flags]

Replays an access log through the real decision path: every log line becomes
the descriptors the given Envoy config's route rate_limits actions would send,
decided by the service with time taken from the log (a simulated clock).
The report gives per rule allowed/denied/shadow, the share of traffic that
would be denied, the top denied clients and paths, and per minute the busiest
clients against their limits.

With --backend redis, counters are written under a fresh key prefix
(replay:<unix nanos>: unless --key-prefix is set); use a scratch Redis, never
the one serving production traffic.

Flags:
`

func parseReplay(args []string, usage io.Writer) (replaycmd.Options, error) {
	o := replaycmd.Options{
		Format: "combined", Order: string(replay.OrderTime), Output: "text", Top: 10,
		Backend: "memory", RedisURL: "redis://127.0.0.1:6379/0", RedisMode: "standalone",
		// Generous: replay runs as fast as it can and must not fail open
		// when scheduling is slow (that would change the results).
		RedisTimeout: time.Second,
	}
	fs := flag.NewFlagSet("ratelimitd replay", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Var(serveopts.List(&o.Config), "config", "ratelimitd YAML config file or directory (repeatable, or comma-separated)")
	fs.StringVar(&o.Envoy, "envoy", "", "Envoy v3 bootstrap YAML whose routes and rate_limits actions build the descriptors")
	fs.StringVar(&o.Log, "log", "", "access log to replay (- for standard input)")
	fs.StringVar(&o.Format, "format", o.Format, "log format: combined (Apache/Nginx combined or common, IPv4 and IPv6)")
	fs.Float64Var(&o.Speed, "speed", 0, "real-time factor: N replays N times faster than the log's own pace; 0 = as fast as possible")
	fs.StringVar(&o.Order, "order", o.Order, "time: sort lines by timestamp (stable); file: file order with a monotonic clock")
	fs.StringVar(&o.Host, "host", "", "Host header for virtual host selection (default: the \"*\" virtual host)")
	fs.StringVar(&o.Output, "output", o.Output, "report format: text, json or html")
	fs.StringVar(&o.Out, "out", "", "write the report to this file instead of standard output")
	fs.IntVar(&o.Top, "top", o.Top, "length of the top denied clients and paths lists")
	fs.BoolVar(&o.ShadowMode, "shadow-mode", false, "global shadow mode: evaluate and report, never deny")
	fs.StringVar(&o.Counting, "counting", "all_or_nothing", "counting policy of rules without counting: all_or_nothing or always_charge")
	fs.BoolVar(&o.MergeDomains, "merge-domains", false, "let several files contribute to one domain")
	fs.BoolVar(&o.Suggest, "suggest", false, "also suggest limits from the traffic: per rule the peak usage per key, a limit of 2.5x the p99 of legitimate keys, what each candidate limit would deny, and the config with the suggested limits in shadow mode")
	fs.StringVar(&o.KeyPrefix, "key-prefix", "", "prefix of every backend key (redis default: replay:<unix nanos>:)")
	fs.StringVar(&o.Backend, "backend", o.Backend, "store: memory or redis")
	fs.StringVar(&o.RedisURL, "redis-url", o.RedisURL, "redis:// or rediss:// URL, with user:password@ for ACL and /db")
	fs.StringVar(&o.RedisMode, "redis-mode", o.RedisMode, "standalone, cluster (seeds in --redis-addrs) or sentinel (--redis-addrs sentinels + --redis-master)")
	fs.Var(serveopts.List(&o.RedisAddrs), "redis-addrs", "host:port list: cluster seed nodes or sentinels")
	fs.StringVar(&o.RedisMaster, "redis-master", "", "sentinel master name")
	fs.DurationVar(&o.RedisTimeout, "redis-timeout", o.RedisTimeout, "per-operation Redis budget")
	fs.IntVar(&o.RedisPoolSize, "redis-pool-size", 0, "Redis connections per node (0 = store default)")
	durErr, restoreDurations := serveopts.ClearDurationErrors(fs)
	fs.Usage = func() {
		fmt.Fprint(usage, replayUsage)
		restoreDurations()
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if *durErr != nil {
			err = *durErr
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	if len(o.Config) == 0 {
		errs = append(errs, errors.New("--config is required"))
	}
	if o.Envoy == "" {
		errs = append(errs, errors.New("--envoy is required"))
	}
	if o.Log == "" {
		errs = append(errs, errors.New("--log is required"))
	}
	if o.Format != "combined" {
		errs = append(errs, fmt.Errorf("--format=%q: only combined is supported", o.Format))
	}
	errs = append(errs, serveopts.OneOf("output", o.Output, "text", "json", "html"), serveopts.OneOf("order", o.Order, "time", "file"),
		serveopts.OneOf("backend", o.Backend, "memory", "redis"), serveopts.OneOf("redis-mode", o.RedisMode, "standalone", "cluster", "sentinel"),
		serveopts.OneOf("counting", o.Counting, "all_or_nothing", "always_charge"))
	if o.Speed < 0 {
		errs = append(errs, fmt.Errorf("--speed=%v: must be >= 0", o.Speed))
	}
	if o.Top < 1 {
		errs = append(errs, fmt.Errorf("--top=%d: must be >= 1", o.Top))
	}
	return o, errors.Join(errs...)
}

// replayMain runs `ratelimitd replay` and returns the exit code: 0 done,
// 1 failure (bad config, Envoy file or log, backend error), 2 usage error.
// SIGINT and SIGTERM stop the replay.
func replayMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseReplay(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimitd replay: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := replaycmd.Run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ratelimitd replay: %v\n", err)
		return 1
	}
	return 0
}
