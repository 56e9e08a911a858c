package rlqs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/loglimit"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/fairshare"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Store charges the usage Envoys report: the shape of the service's Store
// (pkg/service), declared here by its consumer.
type Store interface {
	// Take decides hits as the service's Store documents.
	Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error
}

// Defaults of Options.
const (
	DefaultInterval     = time.Second
	DefaultAbandonAfter = 30 * time.Second
	DefaultHeadroom     = 0.05
	// DefaultMaxBucketsPerStream is Options.MaxBucketsPerStream when 0.
	DefaultMaxBucketsPerStream = 1000
	// handoffTTL is the assignment TTL sent when the server shuts down:
	// the shortest Envoy honours (whole seconds).
	handoffTTL = time.Second
)

// Options configure a Server. Zero values mean the defaults.
type Options struct {
	// Store is charged with the reported usage (required).
	Store Store
	// Durable is charged with the usage of `store: durable` limits
	// (policy.StoreDurable), the store ShouldRateLimit decides them on, so
	// that both count on one counter; nil: such usage fails as a store
	// error (the loader refuses durable limits without a durable store).
	Durable Store
	// MaxBucketsPerStream bounds the buckets one stream may have
	// (DefaultMaxBucketsPerStream): a bucket reported past it is not
	// tracked nor charged, and is answered as a spent budget (DENY_ALL;
	// ALLOW_ALL when its rule never denies), so that one Envoy cannot make
	// every round's store calls as large as it likes.
	MaxBucketsPerStream int
	// Leases, when set, reserves each round's token-bucket assignments on
	// the store up front (reserve.go): the store's Lease, on the counters
	// Store decides (the memory and Redis stores; not through a wrapper
	// that hides it). nil: usage is charged after the fact only.
	Leases LeaseStore
	// Demand shares stream demand among replicas; nil: this process only
	// (NewMemory).
	Demand Demand
	// Interval is the reporting round: every Interval the usage is charged
	// and each limit divided again (DefaultInterval). Envoy's
	// reporting_interval should be the same.
	Interval time.Duration
	// AbandonAfter is how long a bucket may go without a report before the
	// server sends it an AbandonAction and forgets it (DefaultAbandonAfter);
	// several of Envoy's reporting intervals, or live buckets are abandoned.
	AbandonAfter time.Duration
	// Headroom is the share of each limit held by the streams' full
	// buckets together (DefaultHeadroom); the rates share the rest.
	Headroom float64
	// ShadowMode is the global shadow mode (--shadow-mode): every bucket
	// is answered ALLOW_ALL and its usage still charged, as a rule's
	// shadow_mode is.
	ShadowMode bool
	// UnknownDomain, when set, counts a stream whose domain is empty or
	// not in the config, once per stream (ShouldRateLimit's
	// ratelimitd_unknown_domain_requests_total).
	UnknownDomain func()
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Clock is what Run waits on between rounds (clock.System when nil);
	// tests set a clock.Manual to run the rounds.
	Clock bclock.Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the RLQS metrics; nil disables them.
	Registerer prometheus.Registerer
	// Replica names this process in stream ids shared through Demand (a
	// random id when empty).
	Replica string

	// joinTimeout and roundTimeout, when not 0, replace the real-time
	// budgets of a new bucket's join (the constant joinTimeout) and of a
	// round (Interval/2): the package's tests on a real store, whose
	// premise is that the store answers, give them what a loaded host
	// meets without changing Interval.
	joinTimeout, roundTimeout time.Duration
}

// Validate reports every invalid field, joined, each a
// *opterr.FieldError: a nil Store; a negative Interval, AbandonAfter or
// MaxBucketsPerStream; a Headroom outside [0, 0.5). Zero values are
// valid: they mean the defaults.
func (o Options) Validate() error {
	var errs []error
	bad := func(field string, v any, reason string) {
		errs = append(errs, &opterr.FieldError{Package: "rlqs", Field: field, Value: v, Reason: reason})
	}
	if o.Store == nil {
		bad("Store", o.Store, "required")
	}
	if o.Interval < 0 {
		bad("Interval", o.Interval, "must not be negative")
	}
	if o.AbandonAfter < 0 {
		bad("AbandonAfter", o.AbandonAfter, "must not be negative")
	}
	if o.MaxBucketsPerStream < 0 {
		bad("MaxBucketsPerStream", o.MaxBucketsPerStream, "must not be negative")
	}
	if !(o.Headroom >= 0 && o.Headroom < 0.5) {
		bad("Headroom", o.Headroom, "must be in [0, 0.5)")
	}
	return errors.Join(errs...)
}

// Server is the Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService): Envoy's
// rate_limit_quota filter streams usage, and the server answers with quota
// assignments that divide each rule's limit among the streams by demand.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	opt    Options
	log    *slog.Logger
	now    func() time.Time
	set    atomic.Pointer[policy.Set]
	seq    atomic.Uint64
	m      *metrics
	closed chan struct{}
	once   sync.Once

	roundMu sync.Mutex // one Round at a time
	mu      sync.Mutex
	streams map[*stream]struct{}
	keys    map[string]*keyState
	logs    *loglimit.Limiter
	// reported counts processed report messages (tests wait on it).
	reported atomic.Int64
	// joinTimeout bounds the store calls of a new bucket's join, and
	// roundTimeout those of a round (see Options.joinTimeout).
	joinTimeout, roundTimeout time.Duration
}

// keyState is what the server keeps per counter between rounds.
type keyState struct {
	spec      *policy.Spec
	alloc     *fairshare.Allocator
	remote    map[string]int64 // the fleet's demand last shared
	remaining int64            // of the window, from the last charge
	known     bool             // remaining has been read
	pending   int64            // usage not yet charged (a failed charge)
	failed    bool             // the last charge failed
	tries     int              // rounds in a row whose charge the store failed
	behind    int              // rounds in a row whose charge failed, for any reason
	idle      int              // rounds without a local bucket
	held      int64            // units reserved for the local buckets since the last round (reserve.go)
	heldNow   int64            // the part of held granted in window heldWS
	heldWS    int64            // the window (µs) of the latest grant
	penalty   bool             // its rule has a penalty box (Take counts it elsewhere)
}

// New returns a Server; SetPolicy gives it its config.
func New(opt Options) (*Server, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.Demand == nil {
		opt.Demand = NewMemory()
	}
	if opt.Interval == 0 {
		opt.Interval = DefaultInterval
	}
	if opt.AbandonAfter == 0 {
		opt.AbandonAfter = DefaultAbandonAfter
	}
	if opt.Headroom == 0 {
		opt.Headroom = DefaultHeadroom
	}
	if opt.MaxBucketsPerStream == 0 {
		opt.MaxBucketsPerStream = DefaultMaxBucketsPerStream
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Clock == nil {
		opt.Clock = bclock.System{}
	}
	if opt.Replica == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		opt.Replica = hex.EncodeToString(b[:])
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(opt.Registerer)
	if err != nil {
		return nil, err
	}
	join, round := joinTimeout, opt.Interval/2
	if opt.joinTimeout > 0 {
		join = opt.joinTimeout
	}
	if opt.roundTimeout > 0 {
		round = opt.roundTimeout
	}
	return &Server{opt: opt, log: log.With("component", "rlqs"), now: opt.Now, m: m, closed: make(chan struct{}), joinTimeout: join, roundTimeout: round,
		streams: map[*stream]struct{}{}, keys: map[string]*keyState{}, logs: loglimit.New(logEvery)}, nil
}

// Register registers the server on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { rlqspb.RegisterRateLimitQuotaServiceServer(g, s) }

// SetPolicy installs a config: every bucket is matched again and every
// stream gets its assignments again at once.
func (s *Server) SetPolicy(set *policy.Set) {
	if old := s.set.Swap(set); old == set {
		return
	}
	s.mu.Lock()
	n := len(s.streams)
	for st := range s.streams {
		for _, b := range st.buckets {
			s.match(b, set)
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.Round(context.Background())
	}
}

// TTL is the assignment_time_to_live of every assignment: two rounds,
// whole seconds, so that one late round does not expire it.
func (s *Server) TTL() time.Duration { return wholeSeconds(2 * s.opt.Interval) }

// Run runs a round every Interval until ctx is done or Shutdown. A
// round that outlasts Interval is followed by the next at once, as a
// time.Ticker would.
func (s *Server) Run(ctx context.Context) {
	t := s.opt.Clock.NewTimer(s.opt.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.closed:
			return
		case at := <-t.C():
			s.Round(ctx)
			t.Reset(max(s.opt.Interval-s.opt.Clock.Now().Sub(at), 0))
		}
	}
}

// Shutdown hands the streams off: each gets its current assignments again
// with a TTL of one second, then its stream ends, so that Envoy reconnects
// (to another replica) and no Envoy keeps an assignment of this replica
// past a second. Streams that arrive later are refused.
func (s *Server) Shutdown() {
	s.once.Do(func() { close(s.closed) })
}

// Streams is the number of open streams.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// window is the limit's window as a duration of whole seconds.
func window(sp *policy.Spec) time.Duration { return max(sp.Window, time.Second) }

// Round charges the usage reported since the last round to the store, shares
// each counter's demand with the other replicas, divides each limit among
// the fleet's streams and sends every stream its assignments. The store
// calls are chunks of at most chargeChunk counters, all within half an
// interval (charge, shareDemand).
func (s *Server) Round(ctx context.Context) {
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	now := s.now()
	round := now.UnixNano() / int64(s.opt.Interval)
	set := s.set.Load()

	s.mu.Lock()
	s.abandonSilent(now)
	ins := s.gather(set)
	keys := make([]string, 0, len(ins))
	for k, in := range ins {
		ks := s.keyState(k, in.spec)
		ks.pending += in.usage
		keys = append(keys, k)
	}
	// Counters whose streams left still have their last usage to charge.
	hits := make([]algo.Hit, 0, len(s.keys))
	specs := make([]*policy.Spec, 0, len(s.keys))
	behind := make(map[string]int, len(s.keys))
	rets := make(map[string][2]int64)
	for k, ks := range s.keys {
		if _, ok := ins[k]; ok {
			ks.idle = 0
		} else if ks.idle++; ks.idle > 3 && ks.pending == 0 {
			delete(s.keys, k)
			continue
		}
		if s.leased(ks) {
			// The reservation covers usage up to its size; the rest is
			// charged after the fact, and what is left is given back.
			r, ws := settle(ks)
			rets[k] = [2]int64{r, ws}
		}
		cost := min(ks.pending, algo.MaxCost)
		hits = append(hits, algo.Hit{Key: k, Limit: ks.spec.Limit, Cost: cost, Soft: true, Charge: true})
		specs = append(specs, ks.spec)
		behind[k] = ks.behind
	}
	all := s.allBuckets()
	s.mu.Unlock()

	// Counters whose last charges failed go first, so that a round whose
	// budget runs out still makes progress on them.
	order := make([]int, len(hits))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(behind[hits[b].Key], behind[hits[a].Key]); c != 0 {
			return c
		}
		return strings.Compare(hits[a].Key, hits[b].Key)
	})
	hits, specs = permute(hits, order), permute(specs, order)

	ctx, cancel := context.WithTimeout(ctx, s.roundTimeout)
	defer cancel()
	decs, failed, chargeErr := s.charge(ctx, hits, specs, "charge", "charge_durable")
	local := make(map[string]map[string]int64, len(keys))
	for _, k := range keys {
		local[k] = ins[k].local
	}
	views, shareErr := s.shareDemand(ctx, "demand", round, local)

	s.mu.Lock()
	defer s.mu.Unlock()
	if chargeErr != nil {
		s.warn("charge", "rlqs: usage not charged; kept for the next rounds, each rule's failure_mode applies", "err", chargeErr)
	}
	if shareErr != nil {
		s.warn("demand", "rlqs: demand not shared; dividing by the fleet's demand last shared", "err", shareErr)
	}
	var lost int64
	for i, h := range hits {
		ks := s.keys[h.Key]
		if ks == nil {
			continue
		}
		if failed[i] != nil {
			ks.failed = true
			ks.behind++
			if storeFailed(failed[i]) {
				ks.tries++
			}
			if (ks.tries >= maxChargeTries || ks.behind >= maxChargeRounds) && ks.pending > 0 {
				lost += ks.pending
				ks.pending, ks.tries, ks.behind = 0, 0, 0
			}
			continue
		}
		ks.failed, ks.known, ks.tries, ks.behind = false, true, 0, 0
		ks.pending = max(ks.pending-h.Cost, 0)
		ks.remaining = decs[i].Remaining
	}
	if lost > 0 {
		s.m.dropped.WithLabelValues("store").Add(float64(lost))
		s.warn("dropped", "rlqs: usage dropped after failed charges", "requests", lost, "store_failures", maxChargeTries, "rounds", maxChargeRounds)
	}
	for k, v := range views {
		if ks := s.keys[k]; ks != nil {
			s.forgetGone(ks, v)
			ks.remote = v
		}
	}
	per := s.divideAll(now, ins, false)
	if rs := s.reservations(per, rets); len(rs) > 0 {
		s.mu.Unlock()
		s.reserve(ctx, "reserve", rs)
		s.mu.Lock()
		s.applyGrants(per, rs, false)
	}
	s.sendShares(per, all)
}

// chargeChunk bounds the counters of one store call: a stream's report of
// many buckets is charged as many small calls, none of which holds the
// store (and the requests behind it) for long.
const chargeChunk = 128

// maxChargeTries is how many rounds in a row a counter's usage is offered
// to a failing store before it is dropped (and counted in
// ratelimitd_rlqs_usage_dropped_total{reason="store"}); maxChargeRounds
// bounds the rounds in a row it may go uncharged for any reason, such as
// rounds that run out of time (storeFailed).
const (
	maxChargeTries  = 3
	maxChargeRounds = 30
)

// storeFailed reports whether a failed charge shows the store failing:
// every error but one of time alone, a call cut (or not made) because the
// round's budget ran out while the store was not shown failing (no
// Outage, as the backends' errors report it).
func storeFailed(err error) bool {
	if !errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var o interface{ Outage() bool }
	return errors.As(err, &o) && o.Outage()
}

// errNoDurable fails the usage of durable limits on a server without
// Options.Durable.
var errNoDurable = errors.New("rlqs: a limit is on the durable store, and none is configured")

// charge decides hits, in order, in calls of at most chargeChunk hits: a
// limit with `store: durable` on Options.Durable, the others on
// Options.Store. Every call runs within ctx; once ctx is done the calls
// left are not made and their hits fail. It returns each hit's decision,
// each hit's error (nil when charged), and the first error. Each failed
// call is counted under op (on the durable store: durableOp).
func (s *Server) charge(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, op, durableOp string) ([]algo.Decision, []error, error) {
	decs := make([]algo.Decision, len(hits))
	failed := make([]error, len(hits))
	var fast, dur []int
	for i, sp := range specs {
		if sp.Store == policy.StoreDurable {
			dur = append(dur, i)
		} else {
			fast = append(fast, i)
		}
	}
	var first error
	for _, part := range []struct {
		idx []int
		st  Store
		op  string
	}{{fast, s.opt.Store, op}, {dur, s.opt.Durable, durableOp}} {
		for start := 0; start < len(part.idx); start += chargeChunk {
			idx := part.idx[start:min(start+chargeChunk, len(part.idx))]
			h := make([]algo.Hit, len(idx))
			for j, i := range idx {
				h[j] = hits[i]
			}
			d := make([]algo.Decision, len(idx))
			var err error
			switch {
			case part.st == nil:
				err = errNoDurable
			case ctx.Err() != nil:
				err = fmt.Errorf("rlqs: the round's budget ran out before the charge: %w", ctx.Err())
			default:
				err = part.st.Take(ctx, h, d)
			}
			if err != nil {
				s.m.errors.WithLabelValues(part.op).Inc()
				if first == nil {
					first = err
				}
			}
			for j, i := range idx {
				decs[i], failed[i] = d[j], err
			}
		}
	}
	return decs, failed, first
}

// shareDemand is Demand.ShareDemand in calls of at most chargeChunk
// counters, within ctx: the views of the calls that succeeded, and the
// first error. Each failed call is counted under op (demand: a round's;
// demand_join: a new bucket's, within joinTimeout).
func (s *Server) shareDemand(ctx context.Context, op string, round int64, local map[string]map[string]int64) (map[string]map[string]int64, error) {
	names := slices.Sorted(maps.Keys(local))
	out := make(map[string]map[string]int64, len(local))
	var first error
	for start := 0; start < len(names); start += chargeChunk {
		part := make(map[string]map[string]int64, chargeChunk)
		for _, k := range names[start:min(start+chargeChunk, len(names))] {
			part[k] = local[k]
		}
		var views map[string]map[string]int64
		err := ctx.Err()
		if err == nil {
			views, err = s.opt.Demand.ShareDemand(ctx, round, 4*s.opt.Interval, part)
		}
		if err != nil {
			s.m.errors.WithLabelValues(op).Inc()
			if first == nil {
				first = err
			}
			continue
		}
		maps.Copy(out, views)
	}
	return out, first
}

// permute returns xs in the order of idx.
func permute[T any](xs []T, idx []int) []T {
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = xs[i]
	}
	return out
}

// allBuckets lists every bucket of every stream.
func (s *Server) allBuckets() []*bucket {
	var out []*bucket
	for st := range s.streams {
		for _, b := range st.buckets {
			out = append(out, b)
		}
	}
	return out
}

// forgetGone drops the allocator history of streams no longer in the
// fleet's view.
func (s *Server) forgetGone(ks *keyState, v map[string]int64) {
	for id := range ks.remote {
		if _, ok := v[id]; !ok {
			ks.alloc.Forget(id)
		}
	}
}

func (s *Server) keyState(k string, sp *policy.Spec) *keyState {
	ks := s.keys[k]
	if ks == nil {
		ks = &keyState{alloc: fairshare.New(fairshare.Options{})}
		s.keys[k] = ks
	}
	ks.spec = sp
	return ks
}

// logEvery is the least time between two log lines of one kind (warn).
const logEvery = 10 * time.Second

// warn logs msg at most once per logEvery per key, with the number of
// lines suppressed since the last one.
func (s *Server) warn(key, msg string, args ...any) {
	if ok, n := s.logs.Allow(key, s.now()); ok {
		s.log.Warn(msg, append(args, "suppressed", n)...)
	}
}
