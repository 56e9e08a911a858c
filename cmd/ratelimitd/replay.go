package main

// `ratelimitd replay`: wiring only. The replay itself (log parsing, Envoy
// route and action simulation, report) is pkg/replay.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
	"github.com/ratelimitd/ratelimitd/pkg/service"
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

// replayOptions are the flags of `ratelimitd replay`.
type replayOptions struct {
	Config       []string
	Envoy        string
	Log          string
	Format       string
	Speed        float64
	Order        string
	Host         string
	Output       string
	Out          string
	Top          int
	ShadowMode   bool
	Counting     string
	MergeDomains bool
	KeyPrefix    string
	Suggest      bool

	Backend       string
	RedisURL      string
	RedisMode     string
	RedisAddrs    []string
	RedisMaster   string
	RedisTimeout  time.Duration
	RedisPoolSize int
}

func parseReplay(args []string, usage io.Writer) (replayOptions, error) {
	o := replayOptions{
		Format: "combined", Order: string(replay.OrderTime), Output: "text", Top: 10,
		Backend: "memory", RedisURL: "redis://127.0.0.1:6379/0", RedisMode: "standalone",
		// Generous: replay runs as fast as it can and must not fail open
		// on a busy machine (that would change the results).
		RedisTimeout: time.Second,
	}
	fs := flag.NewFlagSet("ratelimitd replay", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Var(&listValue{p: &o.Config}, "config", "ratelimitd YAML config file or directory (repeatable, or comma-separated)")
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
	fs.Var(&listValue{p: &o.RedisAddrs}, "redis-addrs", "host:port list: cluster seed nodes or sentinels")
	fs.StringVar(&o.RedisMaster, "redis-master", "", "sentinel master name")
	fs.DurationVar(&o.RedisTimeout, "redis-timeout", o.RedisTimeout, "per-operation Redis budget")
	fs.IntVar(&o.RedisPoolSize, "redis-pool-size", 0, "Redis connections per node (0 = store default)")
	durErr, restoreDurations := clearDurationErrors(fs)
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
	errs = append(errs, oneOf("output", o.Output, "text", "json", "html"), oneOf("order", o.Order, "time", "file"),
		oneOf("backend", o.Backend, "memory", "redis"), oneOf("redis-mode", o.RedisMode, "standalone", "cluster", "sentinel"),
		oneOf("counting", o.Counting, "all_or_nothing", "always_charge"))
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
	if err := runReplay(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ratelimitd replay: %v\n", err)
		return 1
	}
	return 0
}

func runReplay(ctx context.Context, o replayOptions, stdout, stderr io.Writer) error {
	if o.Backend == "redis" && o.KeyPrefix == "" {
		o.KeyPrefix = "replay:" + strconv.FormatInt(time.Now().UnixNano(), 10) + ":"
	}
	set, warnings, err := policy.Load(policy.LoadOptions{MergeDomains: o.MergeDomains, Keys: policy.KeyOptions{Prefix: o.KeyPrefix}}, o.Config...)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, w)
	}
	env, err := replay.LoadEnvoy(o.Envoy)
	if err != nil {
		return err
	}
	if !set.HasDomain(env.Domain) {
		return fmt.Errorf("%s: the Envoy filter's domain %q is not in the config", o.Envoy, env.Domain)
	}
	clock := &replay.Clock{}
	store, closeStore, err := replayStore(o, clock)
	if err != nil {
		return err
	}
	defer closeStore()

	var in io.Reader = os.Stdin
	if o.Log != "-" {
		f, err := os.Open(o.Log)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		in = f
	}
	counting, err := policy.ParseCounting(o.Counting)
	if err != nil {
		return err
	}
	ropts := replay.Options{
		Envoy: env, Policy: set, Store: store, Clock: clock, ShadowMode: o.ShadowMode, Counting: counting,
		Host: o.Host, Order: replay.Order(o.Order), Speed: o.Speed, Top: o.Top,
	}
	var rep *replay.Report
	if o.Suggest {
		lines, bad, perr := replay.ParseCombined(in)
		if perr != nil {
			return perr
		}
		rep, err = replay.Suggest(ctx, lines, bad, ropts, replay.SuggestOptions{
			Load: policy.LoadOptions{MergeDomains: o.MergeDomains, Keys: policy.KeyOptions{Prefix: o.KeyPrefix}},
			// Candidates replay on the memory store whatever --backend:
			// they need no shared state, and the algorithms are the same.
			NewStore: func(now func() time.Time) (service.Store, func(), error) {
				ms, err := memory.New(memory.Options{Now: now, SweepInterval: -1})
				if err != nil {
					return nil, nil, err
				}
				return ms, func() { _ = ms.Close() }, nil
			},
		})
	} else {
		rep, err = replay.Run(ctx, in, ropts)
	}
	if err != nil {
		return err
	}
	out := stdout
	var file *os.File
	if o.Out != "" {
		if file, err = os.Create(o.Out); err != nil {
			return err
		}
		out = file
	}
	switch o.Output {
	case "json":
		err = rep.WriteJSON(out)
	case "html":
		err = rep.WriteHTML(out)
	default:
		err = rep.WriteText(out)
	}
	if file != nil {
		err = errors.Join(err, file.Close())
	}
	if err == nil && rep.Lines > 0 && rep.Malformed == rep.Lines {
		// The report is written (it lists the malformed lines), but a log
		// of which no line parsed is almost always the wrong format.
		err = fmt.Errorf("none of the %d lines of %s is a combined log line (--format %s): nothing was replayed", rep.Lines, o.Log, o.Format)
	}
	return err
}

// replayStore builds an empty store whose clock is the replay's simulated
// clock.
func replayStore(o replayOptions, clock *replay.Clock) (service.Store, func(), error) {
	if o.Backend == "redis" {
		ro := redis.DefaultOptions()
		ro.URL, ro.Mode, ro.Addrs, ro.MasterName = o.RedisURL, redis.Mode(o.RedisMode), o.RedisAddrs, o.RedisMaster
		ro.Timeout, ro.Now = o.RedisTimeout, clock.Now
		if o.RedisPoolSize > 0 {
			ro.PoolSize = o.RedisPoolSize
		}
		rs, err := redis.New(ro)
		if err != nil {
			return nil, nil, err
		}
		return rs, func() { _ = rs.Close() }, nil
	}
	ms, err := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		return nil, nil, err
	}
	return ms, func() { _ = ms.Close() }, nil
}
