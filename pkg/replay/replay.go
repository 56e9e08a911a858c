// Package replay replays an HTTP access log through ratelimitd's real
// decision path, building every request's descriptors exactly as a given
// Envoy configuration's route rate_limits actions would, with time taken from
// the log (a simulated clock), and reports what the limits would have done:
// per rule allowed / denied / shadow, the share of traffic denied, the top
// denied clients and paths, and per minute the busiest clients against their
// limits (text, JSON or one self-contained HTML page).
//
// It is the "calibrate before you enforce" tool: run it on your own logs
// with the exact Envoy file you will deploy (docs/replay.md).
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Clock is the simulated clock of a replay: the Store and the Service read
// it (pass Clock.Now as their Now option) and Run sets it to each request's
// log timestamp before deciding it. The zero value reads as the Unix epoch.
// Safe for concurrent use.
type Clock struct{ ns atomic.Int64 }

// Now returns the current simulated instant (UTC).
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Set moves the clock to t (backwards too; Run never does).
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Order is how Run orders log lines before replaying them.
type Order string

const (
	// OrderTime replays lines sorted by timestamp (stable: equal stamps
	// keep file order). Apache and Nginx stamp a line with the request's
	// start but write it at completion, so file order is not arrival
	// order; sorting restores the order in which Envoy would have called
	// the rate-limit service. The default.
	OrderTime Order = "time"
	// OrderFile replays lines in file order with a monotonic clock:
	// each request's instant is max(previous instant, its timestamp).
	OrderFile Order = "file"
)

// Options configure Run. Envoy, Policy, Store and Clock are required.
type Options struct {
	// Envoy is the Envoy configuration whose routes and rate_limits
	// actions turn log lines into descriptors.
	Envoy *Envoy
	// Policy is the ratelimitd configuration to evaluate.
	Policy *policy.Set
	// Store is the backend (memory or Redis) the Service decides with. It
	// must read its clock from Clock.Now (memory.Options.Now,
	// redis.Options.Now) and should start empty.
	Store service.Store
	// Clock is the simulated clock shared with Store.
	Clock *Clock
	// ShadowMode is the service's global shadow mode (--shadow-mode).
	ShadowMode bool
	// Counting is the service's global counting policy (--counting);
	// the zero value is all_or_nothing.
	Counting policy.Counting
	// Host selects the Envoy virtual host ("" = the one with domain "*",
	// else the first; combined logs do not record the Host header).
	Host string
	// Order is OrderTime (default, "") or OrderFile.
	Order Order
	// Speed is the real-time factor: 0 replays as fast as possible; N > 0
	// sleeps so that log time advances N times faster than wall time.
	Speed float64
	// Top is the length of the top lists and of the busiest clients per
	// minute (0 means 10 and 3).
	Top int
	// MaxMalformedListed bounds the malformed line numbers listed in the
	// report (0 means 1000); all are counted.
	MaxMalformedListed int
}

// Validate reports missing required options and bad values.
func (o Options) Validate() error {
	var errs []error
	if o.Envoy == nil {
		errs = append(errs, errors.New("replay: Options.Envoy is required"))
	}
	if o.Policy == nil {
		errs = append(errs, errors.New("replay: Options.Policy is required"))
	}
	if o.Store == nil {
		errs = append(errs, errors.New("replay: Options.Store is required"))
	}
	if o.Clock == nil {
		errs = append(errs, errors.New("replay: Options.Clock is required"))
	}
	if o.Order != "" && o.Order != OrderTime && o.Order != OrderFile {
		errs = append(errs, fmt.Errorf("replay: unknown order %q (want time or file)", o.Order))
	}
	if o.Speed < 0 || o.Speed != o.Speed {
		errs = append(errs, fmt.Errorf("replay: speed %v must be >= 0", o.Speed))
	}
	if o.Top < 0 || o.MaxMalformedListed < 0 {
		errs = append(errs, errors.New("replay: negative Top or MaxMalformedListed"))
	}
	return errors.Join(errs...)
}

// recorder wraps the Store and remembers the raw decision of every hit key
// for the request being replayed (across the service's Take rounds), so a
// shadow rule's would-be denial can be attributed.
type recorder struct {
	service.Store
	mu     sync.Mutex
	denied map[string]bool
}

func (r *recorder) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	err := r.Store.Take(ctx, hits, out)
	if err == nil {
		r.mu.Lock()
		for i, h := range hits {
			if !out[i].Allowed {
				r.denied[h.Key] = true
			}
		}
		r.mu.Unlock()
	}
	return err
}

func (r *recorder) reset() {
	r.mu.Lock()
	clear(r.denied)
	r.mu.Unlock()
}

func (r *recorder) wasDenied(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.denied[key]
}

// Run parses log (combined format), replays every request through a
// service.Service built on opts.Store, and returns the report. Malformed
// lines are counted and listed, never fatal. Errors: invalid options, an
// I/O error reading log, ctx cancelled, or the service rejecting a request
// (which means the Envoy configuration produced an invalid descriptor).
func Run(ctx context.Context, log io.Reader, opts Options) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	lines, bad, err := ParseCombined(log)
	if err != nil {
		return nil, err
	}
	return RunLines(ctx, lines, bad, opts)
}

// RunLines is Run on already parsed lines (ParseCombined's results).
func RunLines(ctx context.Context, lines []LogLine, bad []Malformed, opts Options) (*Report, error) {
	return runLines(ctx, lines, bad, opts, nil)
}

// runLines is RunLines, recording per rule and key usage in use when not
// nil.
func runLines(ctx context.Context, lines []LogLine, bad []Malformed, opts Options, use *usage) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Order == "" {
		opts.Order = OrderTime
	}
	if opts.Top == 0 {
		opts.Top = 10
	}
	if opts.MaxMalformedListed == 0 {
		opts.MaxMalformedListed = 1000
	}
	rec := &recorder{Store: opts.Store, denied: map[string]bool{}}
	svc, err := service.New(service.Options{
		Store:       rec,
		ShadowMode:  opts.ShadowMode,
		Counting:    opts.Counting,
		RetryJitter: -1,
		Now:         opts.Clock.Now,
		Rand:        func() float64 { return 0 },
		Logger:      slog.New(quietHandler{slog.Default().Handler()}),
	})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	svc.SetPolicy(opts.Policy)

	lines = slices.Clone(lines)
	if opts.Order == OrderTime {
		slices.SortStableFunc(lines, func(a, b LogLine) int { return a.Time.Compare(b.Time) })
	}
	b := newBuilder(opts)
	b.use = use
	b.rep.Lines = len(lines) + len(bad)
	b.rep.Malformed = len(bad)
	for i, m := range bad {
		if i >= opts.MaxMalformedListed {
			break
		}
		b.rep.MalformedLines = append(b.rep.MalformedLines, m)
	}

	var now time.Time
	wallStart := time.Now()
	for i := range lines {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		l := &lines[i]
		t := l.Time
		if i == 0 || t.After(now) {
			now = t
		}
		if opts.Speed > 0 && i > 0 {
			target := wallStart.Add(time.Duration(float64(now.Sub(lines[0].Time)) / opts.Speed))
			if d := time.Until(target); d > 0 {
				timer := time.NewTimer(d)
				select {
				case <-ctx.Done():
					timer.Stop()
					return nil, fmt.Errorf("replay: %w", ctx.Err())
				case <-timer.C:
				}
			}
		}
		opts.Clock.Set(now)
		if err := b.request(ctx, svc, rec, l, now); err != nil {
			return nil, err
		}
	}
	b.finish()
	return b.rep, nil
}

// quietHandler drops the service's early-warning lines: in a replay they
// are sampled per second of log time, one per crossing key, and the report
// already says which keys come near their limits.
type quietHandler struct{ slog.Handler }

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "early warning") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}
