package service

import (
	"context"
	"errors"
	"slices"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// takeAll decides hits (specs[i] the limit of hits[i]) with one call of
// the primary Store, filling decs and outs; when that call fails, each
// hit's failure_mode decides it (fail). undecided: the call failed by
// deadline or timeout and a hit other than a release was only admitted
// by failure_mode open (see errUndecided). gone: the call failed after
// the caller cancelled the request; nothing was decided (no failure mode,
// no fallback, no decision metric), as nobody receives the answer (see
// errCallerGone).
func (s *Service) takeAll(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	if s.opts.Leases != nil && slices.ContainsFunc(specs, func(sp *policy.Spec) bool { return sp.Consistency == policy.Leased }) {
		return s.takeLeased(ctx, hits, specs, decs, outs)
	}
	return s.takeStore(ctx, hits, specs, decs, outs)
}

// takeStore decides hits with one Store call, failure modes on error.
func (s *Service) takeStore(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	res, err := s.take(ctx, s.opts.Store, "primary", hits)
	if err == nil {
		copy(decs, res)
		return false, false
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		s.m.backendErrors.WithLabelValues(causeCanceled).Inc()
		return false, true
	}
	var failed []int
	if d, f := partialOf(err); len(d) == len(hits) {
		copy(decs, d) // the decided hits; fail fills the failed ones
		failed = f
	} else {
		failed = make([]int, len(hits))
		for i := range failed {
			failed[i] = i
		}
	}
	s.fail(ctx, err, hits, specs, failed, decs, outs)
	if c := causeOf(err); c == causeDeadline || c == causeTimeout {
		for h, o := range outs {
			undecided = undecided || (o == byFailedOpen && !hits[h].Release)
		}
	}
	return undecided, false
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

// storeError is an error the service itself raises about a Store call,
// with a fixed Cause label for ratelimitd_backend_errors_total.
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

// partialOf returns the decisions and failed indexes of err when its chain
// holds a PartialFailure whose indexes are all valid for its decisions,
// else nil.
func partialOf(err error) ([]algo.Decision, []int) {
	var pf PartialFailure
	if !errors.As(err, &pf) {
		return nil, nil
	}
	d, f := pf.Decided()
	for _, i := range f {
		if i < 0 || i >= len(d) {
			return nil, nil
		}
	}
	return d, f
}
