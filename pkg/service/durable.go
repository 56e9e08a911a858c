package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// takeMixed decides a request whose hits are on both stores, all or
// nothing across them. The fast store (Options.Store) decides first: it is
// the cheaper call and the likelier to deny. When it denies, the durable
// hits are only checked (cost 0) except the Kept ones; when it was
// undecided and denied nothing, the durable store is not asked
// (errUndecided); otherwise the durable hits are taken, and when one of
// them denies, refundFast gives back what the fast store consumed. A crash
// or failed refund between the calls over-counts at most one request's
// fast hits; it never admits over a limit. An undecided durable call keeps
// the fast hits too, since failure_mode may still admit the request.
func (s *Service) takeMixed(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	var fast, dur []int
	for i, sp := range specs {
		if sp.Store == policy.StoreDurable {
			dur = append(dur, i)
		} else {
			fast = append(fast, i)
		}
	}
	fh, fspecs, fdecs, fouts := subset(fast, hits, specs)
	fastUndecided, gone := false, false
	if len(fast) > 0 {
		fastUndecided, gone = s.takeOn(ctx, roleFast, fh, fspecs, fdecs, fouts)
		if gone {
			return false, true
		}
	}
	scatter(fast, fdecs, fouts, decs, outs)
	fastDenied := deniesRequest(fh, fdecs)

	dh, dspecs, ddecs, douts := subset(dur, hits, specs)
	if fastUndecided && !fastDenied {
		// Asking the durable store now would charge a request whose
		// answer is DeadlineExceeded; its hits are reported failed open
		// and never answered (decide returns errUndecided).
		for j := range dh {
			ddecs[j], douts[j] = algo.Decision{Allowed: true}, byFailedOpen
		}
		scatter(dur, ddecs, douts, decs, outs)
		return true, false
	}
	if fastDenied {
		for j := range dh {
			if !dh[j].Kept() {
				dh[j].Cost = 0
			}
		}
	}
	durUndecided, gone := s.takeOn(ctx, roleDurable, dh, dspecs, ddecs, douts)
	if !gone {
		scatter(dur, ddecs, douts, decs, outs)
	}
	if !fastDenied && (gone || deniesRequest(dh, ddecs)) {
		s.refundFast(ctx, fast, fh, fdecs, fouts, decs)
	}
	return fastUndecided || durUndecided, gone
}

// refundTimeout bounds a refund of fast hits (refundFast), which may run
// past its request's deadline: long enough for a store under load, short
// enough that a dead one holds no goroutine for long. A request whose
// deadline is later gives its refund until then: the request waits that
// long for it anyway.
const refundTimeout = 2 * time.Second

// refundDeadline is the deadline of a refund for the request of ctx: the
// later of ctx's deadline and refundTimeout from now.
func refundDeadline(ctx context.Context) time.Time {
	dl := time.Now().Add(refundTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(dl) {
		return d
	}
	return dl
}

// subset returns the hits and specs at idx, with decision and outcome
// slices of the same length.
func subset(idx []int, hits []algo.Hit, specs []*policy.Spec) ([]algo.Hit, []*policy.Spec, []algo.Decision, []outcome) {
	h := make([]algo.Hit, len(idx))
	sp := make([]*policy.Spec, len(idx))
	for j, i := range idx {
		h[j], sp[j] = hits[i], specs[i]
	}
	return h, sp, make([]algo.Decision, len(idx)), make([]outcome, len(idx))
}

// scatter copies the decisions and outcomes of a subset back to their
// places idx in the request's decs and outs.
func scatter(idx []int, sdecs []algo.Decision, souts []outcome, decs []algo.Decision, outs []outcome) {
	for j, i := range idx {
		decs[i], outs[i] = sdecs[j], souts[j]
	}
}

// deniesRequest reports whether a hit that is not Soft was denied: what
// makes a store roll a request back (Store).
func deniesRequest(hits []algo.Hit, decs []algo.Decision) bool {
	for j := range hits {
		if !decs[j].Allowed && !hits[j].Soft {
			return true
		}
	}
	return false
}

// refundFast releases (algo.Hit.Release) what the fast hits fh consumed,
// after the durable store denied the request: every hit the fast store or
// the failure_mode local fallback admitted with a cost and does not keep.
// The refunds run detached from the caller's cancellation so that they
// complete (until refundDeadline); the request waits for them until its
// context ends, and a
// refund answered by then replaces the hit's decision, as a denied request
// reports. Each refund is counted in ratelimitd_durable_refunds_total.
func (s *Service) refundFast(ctx context.Context, idx []int, fh []algo.Hit, fdecs []algo.Decision, fouts []outcome, decs []algo.Decision) {
	type refund struct {
		st    Store
		label string
		at    []int // indexes into fh
	}
	refunds := [2]refund{{st: s.opts.Store, label: "primary"}, {st: s.opts.Fallback, label: "fallback"}}
	for j, h := range fh {
		if !fdecs[j].Allowed || h.Kept() || h.Cost == 0 {
			continue
		}
		switch fouts[j] {
		case byStore:
			refunds[0].at = append(refunds[0].at, j)
		case byFallback:
			refunds[1].at = append(refunds[1].at, j)
		}
	}
	type done struct {
		r    *refund
		decs []algo.Decision
	}
	ch := make(chan done, len(refunds))
	n := 0
	for k := range refunds {
		r := &refunds[k]
		if len(r.at) == 0 || r.st == nil {
			continue
		}
		n++
		rh := make([]algo.Hit, len(r.at))
		for m, j := range r.at {
			h := fh[j]
			h.Release, h.Charge, h.Soft = true, false, false
			rh[m] = h
		}
		detached, cancel := context.WithDeadline(context.WithoutCancel(ctx), refundDeadline(ctx))
		go func() {
			defer cancel()
			res := make([]algo.Decision, len(rh))
			err := s.take(detached, r.st, r.label, rh, res)
			if err != nil {
				s.m.durableRefunds.WithLabelValues("error").Inc()
				s.logBackendError("durable/refund", err, "service: refunding the fast-store hits of a request the durable store denied failed; they stay counted")
				res = nil
			} else {
				s.m.durableRefunds.WithLabelValues("ok").Inc()
			}
			ch <- done{r, res}
		}()
	}
	for range n {
		select {
		case d := <-ch:
			for m, j := range d.r.at {
				if d.decs != nil {
					decs[idx[j]] = d.decs[m]
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// storeSplit returns the indexes of the hits of ds (adminPlan's) whose
// limits are on the fast store and on the durable store.
func storeSplit(ds []descState, n int) (fast, dur []int) {
	onDurable := make([]bool, n)
	for i := range ds {
		for _, a := range ds[i].applied {
			onDurable[a.hit] = a.spec.Store == policy.StoreDurable
		}
	}
	for i, d := range onDurable {
		if d {
			dur = append(dur, i)
		} else {
			fast = append(fast, i)
		}
	}
	return fast, dur
}

// checkAll asks each store for the check-only hits (adminPlan's) of its
// limits, filling decs; the first error ends it.
func (s *Service) checkAll(ctx context.Context, ds []descState, hits []algo.Hit, decs []algo.Decision) error {
	fast, dur := storeSplit(ds, len(hits))
	for _, part := range []struct {
		idx   []int
		st    Store
		label string
	}{{fast, s.opts.Store, "primary"}, {dur, s.opts.Durable, "durable"}} {
		if len(part.idx) == 0 {
			continue
		}
		if part.st == nil {
			return errNoDurable
		}
		sub := make([]algo.Hit, len(part.idx))
		for j, i := range part.idx {
			sub[j] = hits[i]
		}
		res := make([]algo.Decision, len(sub))
		if err := s.take(ctx, part.st, part.label, sub, res); err != nil {
			return err
		}
		for j, i := range part.idx {
			decs[i] = res[j]
		}
	}
	return nil
}

// resetStores deletes the counters of hits (adminPlan's) on the store
// that keeps each (Options.Store or Options.Durable), and of all of them
// on the fallback, joining the errors.
func (s *Service) resetStores(ctx context.Context, ds []descState, hits []algo.Hit) error {
	fast, dur := storeSplit(ds, len(hits))
	var errs []error
	for _, part := range []struct {
		idx []int
		st  Store
		pre string
	}{{fast, s.opts.Store, ""}, {dur, s.opts.Durable, "durable: "}} {
		if len(part.idx) == 0 {
			continue
		}
		sub := make([]algo.Hit, len(part.idx))
		for j, i := range part.idx {
			sub[j] = hits[i]
		}
		if r, ok := part.st.(Resetter); !ok {
			errs = append(errs, ErrResetUnsupported)
		} else if err := r.Reset(ctx, sub); err != nil {
			if part.pre != "" {
				err = fmt.Errorf("%s%w", part.pre, err)
			}
			errs = append(errs, err)
		}
	}
	// The fallback's counters too, also when a store fails: while the
	// store is down, they are the ones deciding.
	if fr, ok := s.opts.Fallback.(Resetter); ok && s.opts.Fallback != nil {
		if err := fr.Reset(ctx, hits); err != nil {
			errs = append(errs, fmt.Errorf("fallback: %w", err))
		}
	}
	return errors.Join(errs...)
}
