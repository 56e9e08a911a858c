package service

import (
	"context"
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// takeAll decides hits (specs[i] the limit of hits[i]), filling decs and
// outs: the leased limits from the instance's leases (takeLeased), the
// others in their stores (takeStore). See takeOn for undecided and gone.
func (s *Service) takeAll(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	if s.opts.Leases != nil && slices.ContainsFunc(specs, func(sp *policy.Spec) bool { return sp.Consistency == policy.Leased }) {
		return s.takeLeased(ctx, hits, specs, decs, outs)
	}
	return s.takeStore(ctx, hits, specs, decs, outs)
}

// takeStore decides hits in their stores: with one call of the primary
// Store (takeOn), or, when some limits are on the durable store, with one
// call of each (takeMixed).
func (s *Service) takeStore(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	for _, sp := range specs {
		if sp.Store == policy.StoreDurable {
			return s.takeMixed(ctx, hits, specs, decs, outs)
		}
	}
	return s.takeOn(ctx, roleFast, hits, specs, decs, outs)
}

// storeRole is the store a call goes to: the primary Store (fast) or
// Options.Durable. Each counts its own durations and errors.
type storeRole uint8

const (
	roleFast    storeRole = iota // Options.Store: metrics store "primary", ratelimitd_backend_errors_total
	roleDurable                  // Options.Durable: store "durable", ratelimitd_durable_errors_total
)

// takeOn decides hits (specs[i] the limit of hits[i]) with one call of the
// store of role, filling decs and outs; when that call fails, each hit's
// failure_mode decides it (fail). undecided: the call ran out of the
// caller's time (callerOutOfTime) and a hit other than a release was only
// admitted by failure_mode open (errUndecided). gone: the call failed after
// the caller cancelled the request, so nothing was decided (errCallerGone).
func (s *Service) takeOn(ctx context.Context, role storeRole, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	var err error
	switch {
	case role == roleFast:
		err = s.take(ctx, s.opts.Store, "primary", hits, decs)
	case s.opts.Durable == nil:
		err = errNoDurable
	default:
		err = s.take(ctx, s.opts.Durable, "durable", hits, decs)
	}
	if err == nil {
		return false, false
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		s.m.errorsOf(role).WithLabelValues(causeCanceled).Inc()
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
	s.fail(ctx, role, err, hits, specs, failed, decs, outs)
	if callerOutOfTime(ctx, role, err) {
		for h, o := range outs {
			undecided = undecided || (o == byFailedOpen && !hits[h].Release)
		}
	}
	return undecided, false
}

// callerOutOfTime reports whether a call of the store of role failed
// because the caller's time ran out, which leaves the request undecided
// (errUndecided). For the fast stores that is cause deadline or timeout.
// For the durable store it is cause deadline, or a timeout that is the
// caller's context deadline: its own --durable-timeout and an open circuit
// are store failures, which the rules' failure modes decide.
func callerOutOfTime(ctx context.Context, role storeRole, err error) bool {
	switch causeOf(err) {
	case causeDeadline:
		return true
	case causeTimeout:
		return role == roleFast || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)
	}
	return false
}

// errorsOf is the error counter of role's store.
func (m *metrics) errorsOf(role storeRole) *prometheus.CounterVec {
	if role == roleDurable {
		return m.durableErrors
	}
	return m.backendErrors
}

// take calls st.Take with the request deadline, deciding into out
// (len(out) == len(hits)), and measures it.
func (s *Service) take(ctx context.Context, st Store, label string, hits []algo.Hit, out []algo.Decision) error {
	t0 := s.opts.Now()
	err := st.Take(ctx, hits, out)
	o := &s.m.primaryDuration
	switch label {
	case "fallback":
		o = &s.m.fallbackDuration
	case "durable":
		o = &s.m.durableDuration
	}
	o.get(s.m.backendDuration, label).Observe(s.opts.Now().Sub(t0).Seconds())
	return err
}

// storeError is an error the service itself raises about a Store call,
// with a fixed Cause label for ratelimitd_backend_errors_total.
type storeError string

func (e storeError) Error() string { return string(e) }
func (e storeError) Cause() string { return "fallback" }

// errNoDurable fails the durable hits of a service without
// Options.Durable (the loader refuses such limits unless told a durable
// store is configured, policy.LoadOptions.Durable).
var errNoDurable = causeError{"service: a limit is on the durable store, and none is configured", "unconfigured"}

// causeError is an error the service raises with a fixed Cause label.
type causeError struct{ msg, cause string }

func (e causeError) Error() string { return e.msg }
func (e causeError) Cause() string { return e.cause }

// fail applies each hit's failure_mode after the store of role failed on
// the hits listed in active.
func (s *Service) fail(ctx context.Context, role storeRole, err error, hits []algo.Hit, specs []*policy.Spec, active []int, decs []algo.Decision, outs []outcome) {
	cause := causeOf(err)
	s.obs.backendFailed(role, cause)
	if role == roleDurable {
		s.logBackendError("durable/"+cause, err, "service: durable store failed; applying failure modes to its limits")
	} else {
		s.logBackendError(cause, err, "service: rate limit backend failed; applying failure modes")
	}
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
	res := make([]algo.Decision, len(local))
	var ferr error = errNoFallback
	if s.opts.Fallback != nil {
		sub := make([]algo.Hit, len(local))
		for j, h := range local {
			sub[j] = hits[h]
		}
		ferr = s.take(ctx, s.opts.Fallback, "fallback", sub, res)
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
