package rlqs

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// stream is one Envoy's StreamRateLimitQuotas call (one Envoy and domain).
type stream struct {
	id      string // replica-seq: a subscriber id shared through Demand
	domain  string
	buckets map[string]*bucket // by canonical bucket id; Server.mu
	seq     int
	// domainChecked: the domain was looked up in the config (checkDomain).
	domainChecked bool

	outMu sync.Mutex
	out   map[string]*rlqspb.RateLimitQuotaResponse_BucketAction // not yet sent, by canonical id
	// handedOff is set once the handoff is queued: a round still running
	// must not replace it with a longer TTL.
	handedOff bool
	wake      chan struct{}
}

// What a bucket's rule asks of the server.
type bucketKind uint8

const (
	kindAllow   bucketKind = iota // no rule, unlimited, or only concurrency limits: ALLOW_ALL, nothing charged
	kindShadow                    // shadow mode: charged, ALLOW_ALL
	kindLimited                   // charged and divided
)

// bucket is one bucket of one stream.
type bucket struct {
	st      *stream
	canon   string
	sub     string // subscriber id: stream id and a per-stream number, no request value
	id      *rlqspb.BucketId
	entries []policy.Entry // the bucket id's entries, sorted by key
	kind    bucketKind
	specs   []*policy.Spec // the limits it is charged and divided on
	keys    []string       // the counter key of each of specs
	penalty bool           // its rule has a penalty box
	rate    float64        // requests per second last reported; < 0 before the first whole second
	usage   int64          // admitted requests not yet charged
	last    time.Time      // last report
	sent    *typev3.RateLimitStrategy
}

// canonical encodes a bucket id injectively: its entries sorted by key,
// each length-prefixed.
func canonical(m map[string]string) (string, []policy.Entry) {
	es := make([]policy.Entry, 0, len(m))
	for k, v := range m {
		es = append(es, policy.Entry{Key: k, Value: v})
	}
	slices.SortFunc(es, func(a, b policy.Entry) int { return strings.Compare(a.Key, b.Key) })
	var sb strings.Builder
	for _, e := range es {
		sb.WriteString(strconv.Itoa(len(e.Key)))
		sb.WriteByte(':')
		sb.WriteString(e.Key)
		sb.WriteString(strconv.Itoa(len(e.Value)))
		sb.WriteByte(':')
		sb.WriteString(e.Value)
	}
	return sb.String(), es
}

// match resolves b against set: its entries, sorted by key, are one
// descriptor of the stream's domain.
func (s *Server) match(b *bucket, set *policy.Set) {
	b.kind, b.specs, b.keys, b.penalty = kindAllow, nil, nil, false
	m, ok := set.Match(b.st.domain, b.entries)
	if !ok || m.Rule == nil || m.Rule.Unlimited {
		return
	}
	b.penalty = m.Rule.Penalty.On()
	for i := range m.Rule.Limits {
		sp := &m.Rule.Limits[i]
		if sp.Algorithm == algo.Concurrency {
			continue
		}
		b.specs = append(b.specs, sp)
		b.keys = append(b.keys, set.Key(m, i))
	}
	switch {
	case len(b.specs) == 0:
	case m.Rule.ShadowMode || s.opt.ShadowMode:
		b.kind = kindShadow
	default:
		b.kind = kindLimited
	}
}

// StreamRateLimitQuotas serves one Envoy's stream: each report is recorded
// (a bucket's first report is answered at once), and the assignments of
// every round are sent until the stream ends or the server shuts down.
func (s *Server) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	select {
	case <-s.closed:
		return status.Error(codes.Unavailable, "rlqs: shutting down")
	default:
	}
	st := &stream{id: s.opt.Replica + "-" + strconv.FormatUint(s.seq.Add(1), 10), buckets: map[string]*bucket{},
		out: map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	s.m.streams.Inc()
	defer s.leave(st)

	ctx := gs.Context()
	recv := make(chan *rlqspb.RateLimitQuotaUsageReports)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := gs.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case m := <-recv:
			s.report(st, m)
			s.reported.Add(1)
		case <-st.wake:
			if err := s.flush(st, gs); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			s.handoff(st)
			return s.flush(st, gs)
		}
	}
}

// leave forgets a stream; the other streams on its counters get their
// shares again at the next round (its demand leaves the fleet's view then).
func (s *Server) leave(st *stream) {
	s.mu.Lock()
	delete(s.streams, st)
	for _, b := range st.buckets {
		for _, k := range b.keys {
			if ks := s.keys[k]; ks != nil {
				ks.alloc.Forget(b.sub)
				ks.pending += b.usage
			}
		}
	}
	s.mu.Unlock()
	s.m.streams.Dec()
}

// joinTimeout bounds the store call that shares a new bucket's demand, so
// that its first assignment leaves within 50 ms.
const joinTimeout = 20 * time.Millisecond

// report records one usage report. Envoy sends the domain on the first
// report and may repeat it; a bucket's first report (sent on its first
// request, time_elapsed 0) gets its assignment at once, and the other
// local streams on its counters get theirs again, because the division
// moved. The new demand is shared with the other replicas first, so that
// their next division counts it.
func (s *Server) report(st *stream, m *rlqspb.RateLimitQuotaUsageReports) {
	now := s.now()
	set := s.set.Load()
	us := parse(m)
	s.mu.Lock()
	fresh, over := s.record(st, m.GetDomain(), us, now, set)
	if len(fresh) == 0 {
		s.mu.Unlock()
		s.overBound(st, over, set)
		return
	}
	only := map[string]bool{}
	for _, b := range fresh {
		for _, k := range b.keys {
			only[k] = true
		}
	}
	ins := s.gatherKeys(set, only)
	// A budget (a window longer than the TTL) whose remaining has not been
	// read yet is read now, by a check that charges nothing, so that a
	// bucket's first answer on a spent budget is DENY_ALL. A durable
	// budget is left to the round: a check there writes a row.
	var reads []algo.Hit
	var readSpecs []*policy.Spec
	for _, k := range slices.Sorted(maps.Keys(ins)) {
		sp := ins[k].spec
		ks := s.keys[k]
		if window(sp) > s.TTL() && sp.Store != policy.StoreDurable && (ks == nil || !ks.known) && len(reads) < chargeChunk {
			reads = append(reads, algo.Hit{Key: k, Limit: sp.Limit, Soft: true, Charge: true})
			readSpecs = append(readSpecs, sp)
		}
	}
	s.mu.Unlock()
	s.overBound(st, over, set)

	round := now.UnixNano() / int64(s.opt.Interval)
	ctx, cancel := context.WithTimeout(context.Background(), min(s.joinTimeout, s.roundTimeout))
	defer cancel()
	local := make(map[string]map[string]int64, len(ins))
	for k, in := range ins {
		local[k] = in.local
	}
	// One call at most: a report of many new buckets shares the first
	// chargeChunk counters' demand now, the others at the next round.
	for _, k := range slices.Sorted(maps.Keys(local))[min(chargeChunk, len(local)):] {
		delete(local, k)
	}
	views, err := s.shareDemand(ctx, "demand_join", round, local)
	if err != nil {
		s.warn("demand_join", "rlqs: demand of a new bucket not shared; dividing by the fleet's demand last shared", "err", err)
	}
	var readDecs []algo.Decision
	var readFailed []error
	if len(reads) > 0 {
		// A failed read (counted) leaves the budget unread: the first
		// answer is planned as if unread, and the round reads it.
		readDecs, readFailed, err = s.charge(ctx, reads, readSpecs, "read_join", "read_join")
		if err != nil {
			s.warn("read_join", "rlqs: remaining budget of a new bucket not read; its first answer does not know it", "err", err)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for i, h := range reads {
		if ks := s.keyState(h.Key, readSpecs[i]); readFailed[i] == nil && !ks.known {
			ks.known, ks.remaining = true, readDecs[i].Remaining
		}
	}
	for k, v := range views {
		ks := s.keyState(k, ins[k].spec)
		merged := maps.Clone(ks.remote)
		if merged == nil {
			merged = map[string]int64{}
		}
		maps.Copy(merged, v)
		ks.remote = merged
	}
	// Streams may have left meanwhile: divide among those still here.
	per := s.divideAll(now, s.gatherKeys(set, only), true)
	s.reserveJoin(per, fresh)
	s.sendShares(per, fresh)
}

// reported is one bucket's usage in a report, its id made canonical.
type reported struct {
	u       *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	canon   string
	entries []policy.Entry
}

// parse makes the bucket ids of a report canonical, before the server's
// lock is taken; usages without a bucket id are skipped.
func parse(m *rlqspb.RateLimitQuotaUsageReports) []reported {
	us := make([]reported, 0, len(m.GetBucketQuotaUsages()))
	for _, u := range m.GetBucketQuotaUsages() {
		if bm := u.GetBucketId().GetBucket(); len(bm) > 0 {
			canon, entries := canonical(bm)
			us = append(us, reported{u: u, canon: canon, entries: entries})
		}
	}
	return us
}

// record applies a report's usages to st's buckets and returns the new
// ones, and the usages of new buckets past Options.MaxBucketsPerStream,
// which are not tracked (overBound answers them).
func (s *Server) record(st *stream, domain string, us []reported, now time.Time, set *policy.Set) (fresh []*bucket, over []reported) {
	if st.domain == "" {
		st.domain = domain
	}
	if !st.domainChecked && set != nil {
		st.domainChecked = true
		s.checkDomain(st, set)
	}
	for _, r := range us {
		u := r.u
		b := st.buckets[r.canon]
		known := b != nil
		if b == nil {
			if len(st.buckets) >= s.opt.MaxBucketsPerStream {
				over = append(over, r)
				continue
			}
			st.seq++
			b = &bucket{st: st, canon: r.canon, sub: st.id + "." + strconv.Itoa(st.seq), id: u.GetBucketId(), entries: r.entries, rate: -1}
			st.buckets[r.canon] = b
			if set != nil {
				s.match(b, set)
			}
			fresh = append(fresh, b)
		}
		b.last = now
		b.usage += int64(min(u.GetNumRequestsAllowed(), uint64(algo.MaxCost)))
		n := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
		switch el := u.GetTimeElapsed().AsDuration(); {
		case el >= time.Second:
			b.rate = float64(n) / float64(el/time.Second)
		case known && b.rate < 0 && n > 0:
			// Envoy's first periodic report comes less than a second
			// after the bucket's first one, so its time_elapsed reads 0:
			// its requests took at most a second, a demand of at least n
			// per second, which beats the floor until a whole second.
			b.rate = float64(n)
		}
	}
	return fresh, over
}

// overBound answers the buckets of st reported past its bound
// (Options.MaxBucketsPerStream), outside the server's lock. They are not
// tracked, so their usage is dropped, and each is answered as if its
// budget were spent: DENY_ALL, or ALLOW_ALL when its rule never denies.
// Envoy reports every bucket every interval, so the answer is renewed
// before its TTL ends. It is counted and logged at most once per logEvery.
func (s *Server) overBound(st *stream, over []reported, set *policy.Set) {
	if len(over) == 0 {
		return
	}
	deny := assignment(nil, blanket(typev3.RateLimitStrategy_DENY_ALL), s.TTL()).GetBucketAction()
	allow := assignment(nil, blanket(typev3.RateLimitStrategy_ALLOW_ALL), s.TTL()).GetBucketAction()
	var denied, allowed, dropped int64
	actions := make(map[string]*rlqspb.RateLimitQuotaResponse_BucketAction, len(over))
	for _, r := range over {
		b := bucket{st: st, entries: r.entries}
		if set != nil {
			s.match(&b, set)
		}
		a := &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: r.u.GetBucketId(), BucketAction: allow}
		switch b.kind {
		case kindLimited:
			a.BucketAction = deny
			denied++
			dropped += int64(r.u.GetNumRequestsAllowed())
		case kindShadow:
			allowed++
			dropped += int64(r.u.GetNumRequestsAllowed())
		default:
			allowed++
		}
		actions[r.canon] = a
	}
	st.queueAll(actions)
	s.m.overBound.WithLabelValues("deny_all").Add(float64(denied))
	s.m.overBound.WithLabelValues("allow_all").Add(float64(allowed))
	s.m.assignments.WithLabelValues("deny_all").Add(float64(denied))
	s.m.assignments.WithLabelValues("allow_all").Add(float64(allowed))
	if dropped > 0 {
		s.m.dropped.WithLabelValues("bucket_bound").Add(float64(dropped))
	}
	s.warn("bucket_bound", "rlqs: buckets past the per-stream bound answered as a spent budget, their usage not charged",
		"stream", st.id, "domain", st.domain, "bound", s.opt.MaxBucketsPerStream, "buckets", len(over))
}

// assignment is a QuotaAssignmentAction for one bucket.
func assignment(id *rlqspb.BucketId, st *typev3.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl),
				RateLimitStrategy:    st,
			},
		},
	}
}

// abandonSilent sends an AbandonAction to every bucket without a report
// for AbandonAfter and forgets it.
func (s *Server) abandonSilent(now time.Time) {
	for st := range s.streams {
		for canon, b := range st.buckets {
			if now.Sub(b.last) < s.opt.AbandonAfter {
				continue
			}
			delete(st.buckets, canon)
			for _, k := range b.keys {
				if ks := s.keys[k]; ks != nil {
					ks.alloc.Forget(b.sub)
					ks.pending += b.usage
				}
			}
			s.m.assignments.WithLabelValues("abandon").Inc()
			st.queue(b, &rlqspb.RateLimitQuotaResponse_BucketAction{
				BucketId: b.id,
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
					AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
				},
			})
		}
	}
}

// handoff queues every bucket's last assignment again with a TTL of one
// second: the stream ends next, and the assignment expires before Envoy
// could use it for long against a replica that no longer counts it.
func (s *Server) handoff(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range st.buckets {
		if b.sent != nil {
			st.queue(b, assignment(b.id, b.sent, handoffTTL))
		}
	}
	st.outMu.Lock()
	st.handedOff = true
	st.outMu.Unlock()
}

// queue replaces b's pending action and wakes the stream's sender; after
// the handoff it does nothing.
func (st *stream) queue(b *bucket, a *rlqspb.RateLimitQuotaResponse_BucketAction) {
	st.outMu.Lock()
	if st.handedOff {
		st.outMu.Unlock()
		return
	}
	st.out[b.canon] = a
	st.outMu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// queueAll queues actions (by canonical bucket id) as queue does, under
// one lock and with one wake.
func (st *stream) queueAll(actions map[string]*rlqspb.RateLimitQuotaResponse_BucketAction) {
	st.outMu.Lock()
	if st.handedOff {
		st.outMu.Unlock()
		return
	}
	maps.Copy(st.out, actions)
	st.outMu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// flush sends the pending actions as one response.
func (s *Server) flush(st *stream, gs grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	st.outMu.Lock()
	if len(st.out) == 0 {
		st.outMu.Unlock()
		return nil
	}
	canons := make([]string, 0, len(st.out))
	for c := range st.out {
		canons = append(canons, c)
	}
	slices.Sort(canons)
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, c := range canons {
		resp.BucketAction = append(resp.BucketAction, st.out[c])
	}
	clear(st.out)
	st.outMu.Unlock()
	return gs.Send(resp)
}
