package service

import (
	"context"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// outcome says how a hit's decision was reached.
type outcome uint8

const (
	byStore        outcome = iota // the primary Store decided
	byFallback                    // failure_mode: local, the Fallback store decided
	byFailedOpen                  // backend failed, failure_mode open (or local without a fallback)
	byFailedClosed                // backend failed, failure_mode closed
)

// applied is one limit (Spec) applied to one descriptor.
type applied struct {
	spec *policy.Spec
	info *specInfo // the Spec's response strings
	hit  int       // index into the request's hits
}

// descState is one request descriptor after matching.
type descState struct {
	match    policy.Match
	matched  bool // a rule (or an override) answers the descriptor
	override bool
	cost     int64
	refund   bool      // is_negative_hits: credit cost to every applied limit
	applied  []applied // non-replaced limits, config order
	shadow   bool
	quota    bool

	// results
	denied bool // some applied limit denied (before shadow)
	status *rlsv3.RateLimitResponse_DescriptorStatus
}

// Sizes of the per-request arrays that live on decide's stack; larger
// requests allocate.
const (
	smallDescriptors = 2
	smallEntries     = 8
	smallHits        = 4
)

// scratch holds per-request arrays that descState slices point into
// (stores through ds's pointer make stack arrays escape); decide takes one
// from scratchPool and returns it, cleared, when it returns. Nothing
// outside decide keeps a pointer into it.
type scratch struct {
	entries [smallEntries]policy.Entry
	applied [smallHits]applied
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (sc *scratch) release() {
	clear(sc.entries[:])
	clear(sc.applied[:])
	scratchPool.Put(sc)
}

// errUndecided is ShouldRateLimit's error for a request that the Store
// could not decide within the caller's deadline (cause "deadline": the
// backend was answering; "timeout": it had been silent, which a frozen
// backend and a slow one both are until the circuit opens) and that only
// a failure_mode open would have admitted: admitting it uncounted would
// over-admit whenever the backend is only slow, denying it would punish
// the client for a delay, so the caller's own failure policy decides
// (Envoy: failure_mode_deny), as envoyproxy/ratelimit lets it on a Redis
// error. Failures the backend proves (refused, circuit open, OOM, ...)
// get the failure modes.
var errUndecided = status.Error(codes.DeadlineExceeded, "service: not decided within the caller's deadline (backend slow or stalled); the caller's failure policy applies")

// decide answers req, or returns errUndecided (see there).
func (s *Service) decide(ctx context.Context, sn *snapshot, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	set := sn.set
	domain := req.GetDomain()
	// Costs are clamped to algo.MaxCost here, before any store: every
	// limit denies MaxCost, on every backend alike (hits_addend is up to
	// 2^64-1; the Redis script computes in doubles).
	reqCost := algo.ClampCost(int64(req.GetHitsAddend()))
	if reqCost == 0 {
		reqCost = 1
	}
	descs := req.GetDescriptors()
	var dsArr [smallDescriptors]descState
	var ds []descState
	if len(descs) <= len(dsArr) {
		ds = dsArr[:len(descs)]
	} else {
		ds = make([]descState, len(descs))
	}
	// One backing array for the entries of every descriptor (Match
	// retains them in descState.match for the keys).
	nEntries := 0
	for _, d := range descs {
		nEntries += len(d.GetEntries())
	}
	sc := scratchPool.Get().(*scratch)
	defer sc.release()
	allEntries := sc.entries[:0]
	if nEntries > len(sc.entries) {
		allEntries = make([]policy.Entry, 0, nEntries)
	}
	hasDomain := set.HasDomain(domain)
	var replaced map[string]bool // names of replaced limits; nil when none

	// 1. Match every descriptor.
	for i, d := range descs {
		st := &ds[i]
		st.cost = reqCost
		if h := d.GetHitsAddend(); h != nil {
			st.cost = int64(min(h.GetValue(), uint64(algo.MaxCost)))
		}
		// RateLimitDescriptor.is_negative_hits: hits_addend is a refund.
		st.refund = d.GetIsNegativeHits()
		start := len(allEntries)
		for _, e := range d.GetEntries() {
			allEntries = append(allEntries, policy.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries := allEntries[start:len(allEntries):len(allEntries)]
		if l := d.GetLimit(); l != nil && !s.opts.IgnoreRequestOverrides && hasDomain {
			u, err := overrideUnit(l)
			if err == nil {
				st.match = set.Override(domain, entries, l.GetRequestsPerUnit(), u)
				st.matched = st.match.Rule != nil
				st.override = st.match.Override
			}
		} else if hasDomain {
			st.match, st.matched = set.Match(domain, entries)
			st.matched = st.matched && st.match.Rule != nil
		}
		if st.matched {
			for _, n := range st.match.Rule.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[n] = true
			}
			st.shadow = st.match.Rule.ShadowMode && !st.override
			st.quota = st.match.Rule.QuotaMode || s.opts.QuotaMode
		}
	}

	// 2. Build the hits: one per applied limit, descriptor order then
	// config order. `replaces` drops limits by name (reference 1.5).
	nHits := 0
	for i := range ds {
		if st := &ds[i]; st.matched && !st.match.Rule.Unlimited {
			nHits += len(st.match.Rule.Limits)
		}
	}
	// hits goes to the Store (which may keep it past Take): always its
	// own allocation.
	var hits []algo.Hit
	if nHits > 0 {
		hits = make([]algo.Hit, 0, nHits)
	}
	var specArr [smallHits]*policy.Spec
	specs, allApplied := specArr[:0], sc.applied[:0]
	for i := range ds {
		st := &ds[i]
		if !st.matched || st.match.Rule.Unlimited {
			continue
		}
		r := st.match.Rule
		start := len(allApplied)
		charge := r.Counting == policy.AlwaysCharge || (r.Counting == policy.CountingDefault && s.opts.Counting == policy.AlwaysCharge)
		for k := range r.Limits {
			sp := &r.Limits[k]
			if sp.Name != "" && replaced[sp.Name] {
				continue
			}
			if st.match.Release && sp.Limit.Kind != algo.Concurrency {
				continue
			}
			allApplied = append(allApplied, applied{spec: sp, info: sn.spec(r, sp), hit: len(hits)})
			specs = append(specs, sp)
			hits = append(hits, algo.Hit{
				Key:     set.Key(st.match, k),
				Limit:   sp.Limit,
				Cost:    st.cost,
				Release: st.match.Release || st.refund,
				// always_charge: the hit is charged even when denied.
				Charge: charge,
				// A shadow or quota descriptor's denial does not fail the
				// request, and in global shadow mode nothing does: the
				// store must not roll the request back for them.
				Soft: st.shadow || st.quota || s.opts.ShadowMode,
			})
		}
		if len(allApplied) > start {
			ds[i].applied = allApplied[start:len(allApplied):len(allApplied)]
		}
	}

	// 3. One Store call; failure modes on error.
	var decArr [smallHits]algo.Decision
	var outArr [smallHits]outcome
	var decs []algo.Decision
	var outs []outcome
	if len(hits) <= smallHits {
		decs, outs = decArr[:len(hits)], outArr[:len(hits)]
	} else {
		decs, outs = make([]algo.Decision, len(hits)), make([]outcome, len(hits))
	}
	undecided := false
	if len(hits) > 0 {
		res, err := s.take(ctx, s.opts.Store, "primary", hits)
		if err != nil {
			all := make([]int, len(hits))
			for i := range all {
				all[i] = i
			}
			s.fail(ctx, err, hits, specs, all, decs, outs)
			if c := causeOf(err); c == causeDeadline || c == causeTimeout {
				for h, o := range outs {
					undecided = undecided || (o == byFailedOpen && !hits[h].Release)
				}
			}
		} else {
			copy(decs, res)
		}
	}
	denied := s.evaluate(ds, decs)
	if undecided && !denied {
		return nil, errUndecided
	}

	// 4. Statuses.
	blk := newResponseBlock(len(ds))
	resp := &blk.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range ds {
		resp.Statuses[i] = s.status(&ds[i], decs, outs, blk.statusParts(i))
	}
	if denied {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if s.opts.ShadowMode {
			resp.OverallCode = rlsv3.RateLimitResponse_OK
			s.m.globalShadow.Inc()
			if s.ref != nil {
				s.ref.globalShadow.Inc()
			}
		}
	}
	s.observeDecisions(sn, domain, ds, decs, outs)
	s.observeRefunds(domain, ds, outs)
	if s.dlog != nil {
		keys := make([]string, len(hits))
		for i := range hits {
			keys[i] = hits[i].Key
		}
		s.logDecision(req, ds, keys, resp, denied)
	}
	s.addHeaders(blk, ds, decs, outs, denied && !s.opts.ShadowMode)
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = s.dynamicMetadata(req, ds)
	}
	return resp, nil
}

// evaluate sets each descriptor's denied flag from decs and reports
// whether the request as a whole is denied (reference 1.5 and 3.9): any
// non-shadow, non-quota descriptor denied, or at least one quota
// descriptor with a limit and every such descriptor denied.
func (s *Service) evaluate(ds []descState, decs []algo.Decision) bool {
	enforced := false
	quotaN, quotaOver := 0, 0
	for i := range ds {
		st := &ds[i]
		st.denied = false
		for _, a := range st.applied {
			if !decs[a.hit].Allowed {
				st.denied = true
			}
		}
		if len(st.applied) == 0 || st.shadow {
			continue
		}
		if st.quota {
			quotaN++
			if st.denied {
				quotaOver++
			}
			continue
		}
		if st.denied {
			enforced = true
		}
	}
	return enforced || (quotaN > 0 && quotaOver == quotaN)
}

// observeRefunds counts the is_negative_hits descriptors whose refund a
// store applied to at least one of their limits (not when the backend
// failed and the refund was only answered). domain is a config domain:
// only a matched descriptor has applied limits.
func (s *Service) observeRefunds(domain string, ds []descState, outs []outcome) {
	for i := range ds {
		st := &ds[i]
		if !st.refund || len(st.applied) == 0 {
			continue
		}
		for _, a := range st.applied {
			if o := outs[a.hit]; o == byStore || o == byFallback {
				s.m.refunds.WithLabelValues(domain).Inc()
				s.m.refundUnits.WithLabelValues(domain).Add(float64(st.cost))
				break
			}
		}
	}
}

// take calls st.Take with the request deadline and measures it.
func (s *Service) take(ctx context.Context, st Store, label string, hits []algo.Hit) ([]algo.Decision, error) {
	t0 := s.opts.Now()
	res, err := st.Take(ctx, hits)
	o := &s.m.primaryDuration
	if label != "primary" {
		o = &s.m.fallbackDuration
	}
	o.get(s.m.backendDuration, label).Observe(s.opts.Now().Sub(t0).Seconds())
	if err == nil && len(res) != len(hits) {
		err = errBadResult
	}
	return res, err
}

type storeError string

func (e storeError) Error() string { return string(e) }
func (e storeError) Cause() string { return "bad_result" }

const errBadResult = storeError("service: store returned a decision count different from the hit count")

// fail applies each hit's failure_mode after the primary store failed on
// the hits listed in active.
func (s *Service) fail(ctx context.Context, err error, hits []algo.Hit, specs []*policy.Spec, active []int, decs []algo.Decision, outs []outcome) {
	cause := causeOf(err)
	s.m.backendErrors.WithLabelValues(cause).Inc()
	if s.ref != nil {
		s.ref.redisError.Inc()
	}
	s.logBackendError(cause, err, "service: rate limit backend failed; applying failure modes")
	var local []int
	for _, h := range active {
		switch specs[h].FailureMode {
		case policy.FailClosed:
			if hits[h].Release {
				decs[h], outs[h] = algo.Decision{Allowed: true}, byFailedOpen
				continue
			}
			d := s.opts.FailClosedRetryAfter
			decs[h] = algo.Decision{RetryAfter: d, ResetAfter: d, WindowAfter: d}
			outs[h] = byFailedClosed
		case policy.FailLocal:
			local = append(local, h)
		default:
			decs[h], outs[h] = algo.Decision{Allowed: true}, byFailedOpen
		}
	}
	if len(local) == 0 {
		return
	}
	var res []algo.Decision
	var ferr error = errNoFallback
	if s.opts.Fallback != nil {
		sub := make([]algo.Hit, len(local))
		for j, h := range local {
			sub[j] = hits[h]
		}
		res, ferr = s.take(ctx, s.opts.Fallback, "fallback", sub)
	}
	if ferr != nil {
		s.m.backendErrors.WithLabelValues("fallback").Inc()
		s.logBackendError("fallback", ferr, "service: local fallback limiter failed; failing open")
		for _, h := range local {
			decs[h], outs[h] = algo.Decision{Allowed: true}, byFailedOpen
		}
		return
	}
	for j, h := range local {
		decs[h], outs[h] = res[j], byFallback
	}
}

const errNoFallback = storeError("service: failure_mode local without a fallback store")
