package service

import (
	"context"
	"errors"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// takeLeased decides a request with hits of leased limits: the others
// with one Store call first (takeStore), then the leased ones from the
// local leases (Options.Leases). The request stays all-or-nothing: when
// the store denied it, the leased hits give their units back to the
// lease; when a leased hit denied it, what the store's hits consumed and
// do not keep (algo.Hit.Kept) is reversed by a refund call, as a Redis
// Cluster request across slots is. A leased hit with no units left while
// the store fails gets its failure_mode.
func (s *Service) takeLeased(ctx context.Context, hits []algo.Hit, specs []*policy.Spec, decs []algo.Decision, outs []outcome) (undecided, gone bool) {
	var li, ei []int
	for i, sp := range specs {
		if sp.Consistency == policy.Leased {
			li = append(li, i)
		} else {
			ei = append(ei, i)
		}
	}
	sub := func(idx []int) ([]algo.Hit, []*policy.Spec) {
		h, sp := make([]algo.Hit, len(idx)), make([]*policy.Spec, len(idx))
		for j, i := range idx {
			h[j], sp[j] = hits[i], specs[i]
		}
		return h, sp
	}
	storeDenied := false
	if len(ei) > 0 {
		eh, es := sub(ei)
		ed, eo := make([]algo.Decision, len(ei)), make([]outcome, len(ei))
		undecided, gone = s.takeStore(ctx, eh, es, ed, eo)
		if gone {
			return false, true
		}
		for j, i := range ei {
			decs[i], outs[i] = ed[j], eo[j]
			storeDenied = storeDenied || (!ed[j].Allowed && !eh[j].Soft)
		}
	}
	lh, ls := sub(li)
	ld, failed, undo, err := s.opts.Leases.Take(ctx, lh)
	lo := make([]outcome, len(li))
	if len(failed) > 0 {
		if errors.Is(ctx.Err(), context.Canceled) {
			undo()
			s.m.backendErrors.WithLabelValues(causeCanceled).Inc()
			return false, true
		}
		s.fail(ctx, roleFast, err, lh, ls, failed, ld, lo)
		if callerOutOfTime(ctx, roleFast, err) {
			for _, j := range failed {
				undecided = undecided || (lo[j] == byFailedOpen && !lh[j].Release)
			}
		}
	}
	leaseDenied := false
	for j := range lh {
		leaseDenied = leaseDenied || (!ld[j].Allowed && !lh[j].Soft)
	}
	if storeDenied {
		undo()
	}
	for j, i := range li {
		decs[i], outs[i] = ld[j], lo[j]
	}
	if leaseDenied && !storeDenied && len(ei) > 0 {
		// Refund each exact hit in the store that charged it.
		var refund [2][]algo.Hit // by storeRole
		for _, i := range ei {
			h := hits[i]
			if outs[i] == byStore && decs[i].Allowed && h.Cost > 0 && !h.Kept() {
				h.Release = true
				r := roleFast
				if specs[i].Store == policy.StoreDurable {
					r = roleDurable
				}
				refund[r] = append(refund[r], h)
			}
		}
		s.refundLeaseDenied(ctx, refund)
	}
	return undecided, false
}

// refundLeaseDenied gives back, in each store, the exact hits of a request a
// leased limit denied. Each refund runs detached until refundDeadline, so a
// cancelled request still refunds; the request waits for the refunds only
// until its own deadline, as a stalled store must not hold it past its
// budget. Outcomes are counted in ratelimitd_leased_refunds_total.
func (s *Service) refundLeaseDenied(ctx context.Context, refund [2][]algo.Hit) {
	done := make(chan struct{}, len(refund))
	n := 0
	for r, rh := range refund {
		st := s.opts.Store
		if storeRole(r) == roleDurable {
			st = s.opts.Durable
		}
		if len(rh) == 0 || st == nil {
			continue
		}
		n++
		detached, cancel := context.WithDeadline(context.WithoutCancel(ctx), refundDeadline(ctx))
		go func() {
			defer cancel()
			if err := st.Take(detached, rh, make([]algo.Decision, len(rh))); err != nil {
				s.m.leasedRefunds.WithLabelValues("error").Inc()
				s.logBackendError(causeOf(err), err, "service: refund of a request a leased limit denied failed; its other limits keep the units until their window ends")
			} else {
				s.m.leasedRefunds.WithLabelValues("ok").Inc()
			}
			done <- struct{}{}
		}()
	}
	for range n {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}
