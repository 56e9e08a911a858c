// Package replaycmd runs `ratelimitd replay`: an access log replayed
// through the real decision path on an empty memory or Redis store whose
// clock is the log's (pkg/replay does the replay; this package builds the
// store, reads the files and writes the report).
package replaycmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Options are the flags of `ratelimitd replay` (docs/replay.md), checked
// by the command before Run.
type Options struct {
	Config       []string // --config: config files or directories
	Envoy        string   // --envoy: the Envoy bootstrap whose routes build the descriptors
	Log          string   // --log: the access log; "-" is standard input
	Format       string   // --format: the log format (combined)
	Speed        float64  // --speed: real-time factor; 0 = as fast as possible
	Order        string   // --order: time or file (replay.Order)
	Host         string   // --host: Host header for virtual host selection
	Output       string   // --output: text, json or html
	Out          string   // --out: the report file; "" = stdout
	Top          int      // --top: length of the top denied lists
	ShadowMode   bool     // --shadow-mode: global shadow mode
	Counting     string   // --counting: all_or_nothing or always_charge
	MergeDomains bool     // --merge-domains
	KeyPrefix    string   // --key-prefix; "" with Redis: replay:<unix nanos>:
	Suggest      bool     // --suggest: also suggest limits

	Backend       string        // --backend: memory or redis
	RedisURL      string        // --redis-url
	RedisMode     string        // --redis-mode: standalone, cluster or sentinel
	RedisAddrs    []string      // --redis-addrs: cluster seeds or sentinels
	RedisMaster   string        // --redis-master: the sentinel master name
	RedisTimeout  time.Duration // --redis-timeout: per-operation budget
	RedisPoolSize int           // --redis-pool-size; 0 = the store's default
}

// Run replays the log of o and writes the report to o.Out or stdout;
// warnings of the config load go to stderr. It fails on a bad config,
// Envoy file or log, a backend error, or a log of which no line parsed.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
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
	store, closeStore, err := newStore(o, clock)
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

// newStore builds an empty store whose clock is the replay's simulated
// clock.
func newStore(o Options, clock *replay.Clock) (service.Store, func(), error) {
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
