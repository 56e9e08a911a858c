package service

import (
	"context"
	"sync"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
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
// (stores through ds's pointer make stack arrays escape), and the array
// the Store decides into (an interface call's argument escapes too);
// decide takes one from scratchPool and returns it, cleared, when it
// returns. Nothing outside decide keeps a pointer into it.
type scratch struct {
	entries [smallEntries]policy.Entry
	applied [smallHits]applied
	decs    [smallHits]algo.Decision
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (sc *scratch) release() {
	clear(sc.entries[:])
	clear(sc.applied[:])
	clear(sc.decs[:])
	scratchPool.Put(sc)
}

// errUndecided is ShouldRateLimit's error for a request that the Store
// could not decide within the caller's deadline and that only failure_mode
// open would have admitted. Admitting it uncounted would over-admit
// whenever the backend is only slow, and denying it would punish the client
// for a delay, so the caller's own failure policy decides (Envoy:
// failure_mode_deny). Failures the backend proves get the failure modes.
var errUndecided = status.Error(codes.DeadlineExceeded, "service: not decided within the caller's deadline (backend slow or stalled); the caller's failure policy applies")

// errCallerGone is ShouldRateLimit's error for a request whose caller
// cancelled it (Envoy: the downstream went away, or the filter's timeout
// fired and Envoy reset the stream) while a failed Store call was pending.
// Nobody receives an answer, so no failure mode is applied and no decision
// is counted in ratelimitd_decisions_total; the backend error is counted
// with cause "canceled". A Store call that succeeded is answered as usual
// (it was counted).
var errCallerGone = status.Error(codes.Canceled, "service: the caller cancelled the request before the backend answered; nothing was decided")

// decide answers req, or returns errUndecided or errCallerGone (see there).
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
	// 1. Match every descriptor.
	replaced := s.matchAll(set, domain, reqCost, descs, ds, allEntries)

	// 2. Build the hits: one per applied limit, descriptor order then
	// config order. `replaces` drops limits by name (docs/config.md,
	// "Matching").
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
		charge := s.charges(r)
		for k := range r.Limits {
			sp := &r.Limits[k]
			if !applies(st, sp, replaced) {
				continue
			}
			allApplied = append(allApplied, applied{spec: sp, info: sn.spec(r, sp), hit: len(hits)})
			specs = append(specs, sp)
			hits = append(hits, s.hit(set, st, k, charge))
		}
		if len(allApplied) > start {
			ds[i].applied = allApplied[start:len(allApplied):len(allApplied)]
		}
	}

	// 3. One Store call; failure modes on error.
	var outArr [smallHits]outcome
	var decs []algo.Decision
	var outs []outcome
	if len(hits) <= smallHits {
		decs, outs = sc.decs[:len(hits)], outArr[:len(hits)]
	} else {
		decs, outs = make([]algo.Decision, len(hits)), make([]outcome, len(hits))
	}
	undecided, gone := false, false
	if len(hits) > 0 {
		undecided, gone = s.takeAll(ctx, hits, specs, decs, outs)
	}
	if gone {
		return nil, errCallerGone
	}
	denied := s.evaluate(ds, decs)
	if undecided && !denied {
		return nil, errUndecided
	}

	// 4. Statuses, metrics, headers.
	return s.respond(sn, req, ds, hits, decs, outs, denied), nil
}

// matchAll matches every request descriptor descs[i] into ds[i] (its cost:
// the descriptor's hits_addend, else the request's reqCost; its refund
// flag; its match), copying the entries into allEntries, which must have
// room for all of them (Match keeps them). It returns the names of the
// limits the matched rules replace, nil when none.
func (s *Service) matchAll(set *policy.Set, domain string, reqCost int64, descs []*ratelimitv3.RateLimitDescriptor, ds []descState, allEntries []policy.Entry) (replaced map[string]bool) {
	hasDomain := set.HasDomain(domain)
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
		s.matchDescriptor(st, set, domain, hasDomain, d, entries)
		if st.matched {
			for _, n := range st.match.Rule.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[n] = true
			}
		}
	}
	return replaced
}

// respond builds the response of a decided request (denied: as evaluate
// found, before global shadow mode): the statuses, the overall code, the
// headers and the dynamic metadata; it records the decisions in the
// metrics and the decision log.
func (s *Service) respond(sn *snapshot, req *rlsv3.RateLimitRequest, ds []descState, hits []algo.Hit, decs []algo.Decision, outs []outcome, denied bool) *rlsv3.RateLimitResponse {
	domain := req.GetDomain()
	blk := newResponseBlock(len(ds))
	resp := &blk.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range ds {
		resp.Statuses[i] = s.status(&ds[i], decs, outs, blk.statusParts(i))
	}
	if denied {
		resp.OverallCode = s.overLimit()
	}
	s.observeDecisions(sn, domain, ds, decs, outs)
	s.observeEarlyWarnings(domain, ds, hits, decs, outs, denied)
	s.observePenalties(domain, ds, hits, decs, outs)
	s.observeRefunds(domain, ds, outs)
	s.observeAddressPolicies(domain, ds, hits, decs, outs)
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
	return resp
}

// charges reports whether the hits of rule r are charged even when denied:
// the rule's counting is always_charge, or it has none and the global
// policy (Options.Counting) is.
func (s *Service) charges(r *policy.Rule) bool {
	return r.Counting == policy.AlwaysCharge || (r.Counting == policy.CountingDefault && s.opts.Counting == policy.AlwaysCharge)
}

// hit is the hit of limit k of descriptor st's rule: its backend key and
// limit, the descriptor's cost, and how the store must count it.
func (s *Service) hit(set *policy.Set, st *descState, k int, charge bool) algo.Hit {
	h := algo.Hit{
		Key:     set.Key(st.match, k),
		Limit:   st.match.Rule.Limits[k].Limit,
		Cost:    st.cost,
		Release: st.match.Release || st.refund,
		// always_charge: the hit is charged even when denied.
		Charge: charge,
		// A shadow or quota descriptor's denial does not fail the
		// request, and in global shadow mode nothing does: the store
		// must not roll the request back for them.
		Soft: st.shadow || st.quota || s.opts.ShadowMode,
	}
	if !h.Soft {
		// a Soft hit never counts denials or blocks (algo.Hit.Penalty)
		h.Penalty = st.match.Rule.Penalty
	}
	return h
}

// overLimit is the overall code of a denied request: OVER_LIMIT, or OK
// in global shadow mode (counted in ratelimitd_global_shadow_total).
func (s *Service) overLimit() rlsv3.RateLimitResponse_Code {
	if !s.opts.ShadowMode {
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	s.obs.globalShadow()
	return rlsv3.RateLimitResponse_OK
}

// applies reports whether limit sp of descriptor st's rule is applied: it
// is not named in a matched rule's `replaces` (replaced), and for a
// concurrency lease release only concurrency limits are.
func applies(st *descState, sp *policy.Spec, replaced map[string]bool) bool {
	if sp.Name != "" && replaced[sp.Name] {
		return false
	}
	return !st.match.Release || sp.Limit.Kind == algo.Concurrency
}

// matchDescriptor resolves request descriptor d (with its entries) against
// set into st: a limit override (RateLimitDescriptor.limit, when
// Options.RequestOverrides) through (*policy.Set).Override, else the
// config match; a Match without a Rule is not matched. It then sets the
// descriptor's shadow and quota modes. hasDomain is set.HasDomain(domain):
// an unknown domain matches nothing.
func (s *Service) matchDescriptor(st *descState, set *policy.Set, domain string, hasDomain bool, d *ratelimitv3.RateLimitDescriptor, entries []policy.Entry) {
	if l := d.GetLimit(); l != nil && !s.opts.IgnoreRequestOverrides && hasDomain {
		if u, err := overrideUnit(l); err == nil {
			st.match = set.Override(domain, entries, l.GetRequestsPerUnit(), u)
			st.matched = st.match.Rule != nil
			st.override = st.match.Override
		}
	} else if hasDomain {
		st.match, st.matched = set.Match(domain, entries)
		st.matched = st.matched && st.match.Rule != nil
	}
	if st.matched {
		// Adaptive reserve: a marked rule's non-critical requests get
		// the saturated share.
		if r := st.match.Rule; r.Reduced && !st.override {
			if sv := r.SaturatedVariant(); sv != nil && s.saturated(domain, r) {
				st.match.Rule = sv
			}
		}
		st.shadow = st.match.Rule.ShadowMode && !st.override
		st.quota = st.match.Rule.QuotaMode || s.opts.QuotaMode
	}
}

// evaluate sets each descriptor's denied flag from decs and reports
// whether the request as a whole is denied (docs/responses.md,
// "overall_code"): any
// non-shadow, non-quota descriptor denied, or (not in reference mode,
// answerPolicy.quotaDenies) at least one quota descriptor with a limit
// and every such descriptor denied.
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
	return enforced || (s.answers.quotaDenies() && quotaN > 0 && quotaOver == quotaN)
}
