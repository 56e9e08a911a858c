package replay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// builder accumulates a Report.
type builder struct {
	opts    Options
	rep     *Report
	rules   map[string]*RuleStats
	shapes  map[string]int
	clients map[string]*TopEntry
	paths   map[string]*TopEntry
	minutes map[int64]*minuteAcc
	// use records per rule and key usage for replay --suggest (nil
	// otherwise).
	use *usage
	now time.Time
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
	b.now = now
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
	anyShadow := b.tally(route, resp, rec, cm)
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

// tally counts the answer resp to route's enforced descriptors per rule
// (denied, shadow or allowed; unmatched descriptors by shape) and records
// each status's limit in the client's minute cm. anyShadow: a descriptor
// was over its limit without denying the request (shadow mode), or its
// rule is in shadow mode and the store denied one of its hits.
func (b *builder) tally(route Route, resp *rlsv3.RateLimitResponse, rec *recorder, cm *ClientMinute) (anyShadow bool) {
	for i, d := range route.Descriptors {
		m, matched := b.opts.Policy.Match(route.Domain, d.Entries)
		if !matched || m.Rule == nil {
			b.rep.Unmatched++
			b.shapes[shape(d.Entries)]++
			continue
		}
		rs := b.rule(route.Domain, m.Rule)
		var st *rlsv3.RateLimitResponse_DescriptorStatus
		if i < len(resp.GetStatuses()) {
			st = resp.GetStatuses()[i]
		}
		deniedLimit := func(k int) bool { return rec.wasDenied(b.opts.Policy.Key(m, k)) }
		rawDenied := false
		for k := range m.Rule.Limits {
			if deniedLimit(k) {
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
		cm.observe(st)
		if b.use != nil && !m.Release {
			b.use.add(route.Domain, m.Rule, d, b.now, deniedLimit)
		}
	}
	return anyShadow
}

// observe keeps st's limit as the client's tightest of the minute when it
// has the least remaining relative to its size.
func (cm *ClientMinute) observe(st *rlsv3.RateLimitResponse_DescriptorStatus) {
	cl := st.GetCurrentLimit()
	if cl == nil || cl.GetRequestsPerUnit() == 0 {
		return
	}
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

// describeSpec renders a limit for the report: "policy: 10/minute",
// "5/2 minutes sliding_window", "3 concurrent".
func describeSpec(s policy.Spec) string {
	unit := strings.ToLower(s.Unit.String())
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

// finish computes the shares and fills the sorted lists of the report:
// rules, unmatched shapes, top clients and paths, and per minute the
// busiest clients.
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
