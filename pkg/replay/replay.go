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
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

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

func (r *recorder) Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	d, err := r.Store.Take(ctx, hits)
	if err == nil && len(d) == len(hits) {
		r.mu.Lock()
		for i, h := range hits {
			if !d[i].Allowed {
				r.denied[h.Key] = true
			}
		}
		r.mu.Unlock()
	}
	return d, err
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

// builder accumulates a Report.
type builder struct {
	opts    Options
	rep     *Report
	rules   map[string]*RuleStats
	shapes  map[string]int
	clients map[string]*TopEntry
	paths   map[string]*TopEntry
	minutes map[int64]*minuteAcc
}

type minuteAcc struct {
	m       Minute
	clients map[string]*ClientMinute
}

func newBuilder(opts Options) *builder {
	return &builder{
		opts:    opts,
		rep:     &Report{Domain: opts.Envoy.Domain, Order: string(opts.Order), ShadowMode: opts.ShadowMode},
		rules:   map[string]*RuleStats{},
		shapes:  map[string]int{},
		clients: map[string]*TopEntry{},
		paths:   map[string]*TopEntry{},
		minutes: map[int64]*minuteAcc{},
	}
}

func toRLS(domain string, ds []Descriptor) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, d := range ds {
		rd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.HitsAddend > 0 {
			rd.HitsAddend = wrapperspb.UInt64(d.HitsAddend)
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

// requestOf turns a log line into what the Envoy filter sees.
func requestOf(l *LogLine) *Request {
	r := &Request{Client: l.Client, Method: l.Method, Path: l.Target, Headers: map[string]string{}}
	if l.HasUA {
		r.Headers["user-agent"] = l.UA
	}
	if l.HasRefer {
		r.Headers["referer"] = l.Referer
	}
	return r
}

func (b *builder) rule(domain string, r *policy.Rule) *RuleStats {
	k := domain + "\x00" + r.Path
	rs := b.rules[k]
	if rs == nil {
		rs = &RuleStats{Domain: domain, Path: r.Path, ShadowMode: r.ShadowMode, Unlimited: r.Unlimited}
		for _, s := range r.Limits {
			rs.Limits = append(rs.Limits, describeSpec(s))
		}
		if len(r.Limits) > 0 {
			rs.Name = r.Limits[0].Policy
		}
		b.rules[k] = rs
	}
	return rs
}

func (b *builder) request(ctx context.Context, svc *service.Service, rec *recorder, l *LogLine, now time.Time) error {
	rep := b.rep
	rep.Requests++
	if rep.First.IsZero() || now.Before(rep.First) {
		rep.First = now
	}
	if now.After(rep.Last) {
		rep.Last = now
	}
	req := requestOf(l)
	route, ok := b.opts.Envoy.Match(b.opts.Host, req)
	client := l.Client.String()
	path, _, _ := strings.Cut(l.Target, "?")
	min := b.minute(now)
	cm := min.clients[client]
	if cm == nil {
		cm = &ClientMinute{Client: client, MinRemaining: -1}
		min.clients[client] = cm
	}
	min.m.Requests++
	cm.Requests++
	if !ok || len(route.Descriptors) == 0 {
		if !ok {
			rep.NoRoute++
		}
		rep.NotChecked++
		// No call before the request: the rate-limit filter lets it through
		// and still sends its stream-done descriptors.
		return b.streamDone(ctx, svc, l, route.Domain, route.OnStreamDone)
	}
	rec.reset()
	resp, err := svc.ShouldRateLimit(ctx, toRLS(route.Domain, route.Descriptors))
	if err != nil {
		return fmt.Errorf("replay: log line %d: %w", l.Line, err)
	}
	rep.Descriptors += len(route.Descriptors)
	anyShadow := false
	for i, d := range route.Descriptors {
		m, matched := b.opts.Policy.Match(route.Domain, d.Entries)
		if !matched || m.Rule == nil {
			rep.Unmatched++
			b.shapes[shape(d.Entries)]++
			continue
		}
		rs := b.rule(route.Domain, m.Rule)
		var st *rlsv3.RateLimitResponse_DescriptorStatus
		if i < len(resp.GetStatuses()) {
			st = resp.GetStatuses()[i]
		}
		rawDenied := false
		for k := range m.Rule.Limits {
			if rec.wasDenied(b.opts.Policy.Key(m, k)) {
				rawDenied = true
			}
		}
		over := st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		switch {
		case over && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			rs.Denied++
		case over || (rawDenied && m.Rule.ShadowMode):
			rs.Shadow++
			anyShadow = true
		default:
			rs.Allowed++
		}
		if cl := st.GetCurrentLimit(); cl != nil && cl.GetRequestsPerUnit() > 0 {
			// The tightest limit is the one with the least remaining
			// relative to its size.
			ratio := float64(st.GetLimitRemaining()) / float64(cl.GetRequestsPerUnit())
			if cm.MinRemaining < 0 || ratio < cm.ratio {
				cm.ratio = ratio
				cm.MinRemaining = int64(st.GetLimitRemaining())
				cm.Limit = fmt.Sprintf("%s %d/%s", cl.GetName(), cl.GetRequestsPerUnit(), strings.ToLower(cl.GetUnit().String()))
				if cl.GetName() == "" {
					cm.Limit = strings.TrimSpace(cm.Limit)
				}
			}
		}
	}
	switch {
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		rep.Denied++
		min.m.Denied++
		cm.Denied++
		b.top(b.clients, client).Denied++
		b.top(b.paths, path).Denied++
	case anyShadow:
		rep.ShadowDenied++
		min.m.Shadow++
		cm.Shadow++
		b.top(b.clients, client).Shadow++
		b.top(b.paths, path).Shadow++
	default:
		rep.Allowed++
	}
	// Envoy answers a denied request itself (429): the filters after the
	// rate-limit filter never run, so a release gated on a header they add
	// is not sent (docs/algorithms/concurrency.md).
	done := route.OnStreamDone
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		done = route.OnStreamDoneDenied
	}
	return b.streamDone(ctx, svc, l, route.Domain, done)
}

// streamDone sends the apply_on_stream_done descriptors of a request. Envoy
// sends them when the stream completes, fire and forget; a log line's
// request has completed by definition.
func (b *builder) streamDone(ctx context.Context, svc *service.Service, l *LogLine, domain string, done []Descriptor) error {
	if len(done) == 0 {
		return nil
	}
	b.rep.StreamDoneCalls++
	if _, err := svc.ShouldRateLimit(ctx, toRLS(domain, done)); err != nil {
		return fmt.Errorf("replay: log line %d (apply_on_stream_done): %w", l.Line, err)
	}
	return nil
}

func (b *builder) top(m map[string]*TopEntry, k string) *TopEntry {
	e := m[k]
	if e == nil {
		e = &TopEntry{Key: k}
		m[k] = e
	}
	return e
}

func (b *builder) minute(t time.Time) *minuteAcc {
	k := t.Unix() / 60
	m := b.minutes[k]
	if m == nil {
		m = &minuteAcc{m: Minute{Start: time.Unix(k*60, 0).UTC()}, clients: map[string]*ClientMinute{}}
		b.minutes[k] = m
	}
	return m
}

func shape(es []policy.Entry) string {
	ks := make([]string, len(es))
	for i, e := range es {
		ks[i] = e.Key
	}
	return strings.Join(ks, ",")
}

func describeSpec(s policy.Spec) string {
	unit := strings.ToLower(unitName(s.Unit))
	if s.UnitMultiplier > 1 {
		unit = fmt.Sprintf("%d %ss", s.UnitMultiplier, unit)
	}
	d := fmt.Sprintf("%d/%s", s.RequestsPerUnit, unit)
	switch s.Limit.Kind {
	case algo.TokenBucket:
		burst := s.Burst
		if burst == 0 {
			burst = int64(s.RequestsPerUnit)
		}
		d += fmt.Sprintf(" token_bucket burst %d", burst)
	case algo.SlidingWindow:
		d += " sliding_window"
	case algo.SlidingLog:
		d += " sliding_log"
	case algo.Concurrency:
		d = fmt.Sprintf("%d concurrent", s.RequestsPerUnit)
	}
	if s.Policy != "" {
		d = s.Policy + ": " + d
	}
	return d
}

func unitName(u policy.Unit) string {
	switch u {
	case policy.Second:
		return "second"
	case policy.Minute:
		return "minute"
	case policy.Hour:
		return "hour"
	case policy.Day:
		return "day"
	case policy.Week:
		return "week"
	case policy.Month:
		return "month"
	case policy.Year:
		return "year"
	}
	return "unknown"
}

func (b *builder) finish() {
	rep := b.rep
	if rep.Requests > 0 {
		rep.DeniedShare = float64(rep.Denied) / float64(rep.Requests)
		rep.ShadowShare = float64(rep.ShadowDenied) / float64(rep.Requests)
	}
	for _, rs := range b.rules {
		rep.Rules = append(rep.Rules, *rs)
	}
	sort.Slice(rep.Rules, func(i, j int) bool {
		a, c := rep.Rules[i], rep.Rules[j]
		return cmp.Or(cmp.Compare(a.Domain, c.Domain), cmp.Compare(a.Path, c.Path)) < 0
	})
	for k, n := range b.shapes {
		rep.UnmatchedShapes = append(rep.UnmatchedShapes, TopEntry{Key: k, Denied: n})
	}
	sortTop(rep.UnmatchedShapes)
	rep.TopDeniedClients = topOf(b.clients, b.opts.Top)
	rep.TopDeniedPaths = topOf(b.paths, b.opts.Top)
	busiest := 3
	if b.opts.Top > 0 && b.opts.Top < busiest {
		busiest = b.opts.Top
	}
	keys := make([]int64, 0, len(b.minutes))
	for k := range b.minutes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ma := b.minutes[k]
		cs := make([]ClientMinute, 0, len(ma.clients))
		for _, c := range ma.clients {
			cs = append(cs, *c)
		}
		sort.Slice(cs, func(i, j int) bool {
			if cs[i].Requests != cs[j].Requests {
				return cs[i].Requests > cs[j].Requests
			}
			return cs[i].Client < cs[j].Client
		})
		if len(cs) > busiest {
			cs = cs[:busiest]
		}
		ma.m.Busiest = cs
		rep.Minutes = append(rep.Minutes, ma.m)
	}
}

func sortTop(es []TopEntry) {
	sort.Slice(es, func(i, j int) bool {
		a, c := es[i].Denied+es[i].Shadow, es[j].Denied+es[j].Shadow
		if a != c {
			return a > c
		}
		return es[i].Key < es[j].Key
	})
}

func topOf(m map[string]*TopEntry, n int) []TopEntry {
	es := make([]TopEntry, 0, len(m))
	for _, e := range m {
		es = append(es, *e)
	}
	sortTop(es)
	if len(es) > n {
		es = es[:n]
	}
	return es
}
