package redis

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// sweepTick is the sweeper's period for a Timeout: a tenth of it, between
// 100 µs and 1 ms. It is the slack of the Timeout (see batcher).
func sweepTick(timeout time.Duration) time.Duration {
	return min(time.Millisecond, max(100*time.Microsecond, timeout/10))
}

// ErrCallTimeout is the error of a call whose budget ran out while Redis
// looked stalled: a request written to one of its sockets at least
// Options.Timeout ago had no byte of reply since (its cause is
// CauseTimeout, an outage; errors.Is context.DeadlineExceeded), before
// the stall is established (see ErrStalled).
var ErrCallTimeout error = newError(CauseTimeout, true,
	fmt.Errorf("redis: no reply within the timeout: %w", context.DeadlineExceeded))

// ErrStalled is the error of a call on a master whose stall is
// established: its sockets have had a request unanswered, with nothing
// received, for establishAfter, and the call itself has waited a
// Timeout (or its budget ran out) with still nothing received. Its cause
// is CauseStalled, an outage: the rules' failure modes answer, as for a
// dead Redis.
var ErrStalled error = newError(CauseStalled, true,
	errors.New("redis: stalled: no reply from redis, stall established"))

// ErrDeadline is the error of a call whose budget ran out while Redis was
// answering: ratelimitd could not decide within the caller's deadline
// (CPU starvation, a burst beyond what fits in it), but the backend did
// not fail. Its cause is CauseDeadline, not an outage, and it never opens
// the circuit; errors.Is context.DeadlineExceeded. The hit may have been
// counted.
var ErrDeadline error = newError(CauseDeadline, false,
	fmt.Errorf("redis: not decided within the caller's deadline: %w", context.DeadlineExceeded))

// kickSweeper wakes the sweeper unless it ticks already.
func (b *batcher) kickSweeper() {
	b.mu.Lock()
	kick := !b.sweeping && !b.closed
	b.sweeping = b.sweeping || kick
	b.mu.Unlock()
	if kick {
		b.sweepWake <- struct{}{}
	}
}

// ctxError is the error of a call whose context ended before it was
// decided: budgetError when its deadline passed (the sweeper normally
// completes the call a margin earlier), the context's error otherwise
// (canceled: the caller is gone).
func (b *batcher) ctxError(err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	b.mu.Lock()
	stalled := b.stalledLocked()
	est := b.establishedLocked(b.clock())
	b.mu.Unlock()
	return budgetError(stalled, est)
}

// sweeper, once woken (sweepWake), every tick completes the pending calls
// whose budget has passed, reports overdue invocations, and completes
// every pending call with ErrCircuitOpen while the circuit is open. At the
// first tick without a pending call it parks until the next wake
// (kickSweeper, slotConn.timer); it ends once the batcher is closed.
func (b *batcher) sweeper() {
	defer b.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-b.sweepWake:
		case <-b.quit:
			return
		}
		for {
			t.Reset(b.tick)
			<-t.C
			if !b.sweep() {
				break
			}
		}
	}
}

// sweep is one tick of the sweeper; it reports whether calls are still
// pending, and when none is, it clears b.sweeping (the sweeper parks).
func (b *batcher) sweep() bool {
	b.sweeps.Add(1)
	now := b.clock()
	b.mu.Lock()
	var open error
	if b.open != nil {
		open = b.open()
	}
	stalled := b.stalledLocked()
	est := b.establishedLocked(now)
	pending := b.sweepLocked(b.queue, now, open, stalled, est)
	for _, f := range b.flights {
		pending += b.sweepLocked(f, now, open, stalled, est)
	}
	var overdue int64 = -1
	if stalled && b.stallFrom != 0 {
		if k := (now - b.stallFrom) / int64(b.timeout); k > b.strikes {
			b.strikes = k
			overdue = b.stallFrom
		}
	}
	if pending == 0 {
		b.sweeping = false
	}
	b.mu.Unlock()
	if b.overdue != nil && overdue >= 0 {
		b.overdue(b.epoch.Add(time.Duration(overdue)))
	}
	return pending > 0
}

// stalledLocked reports whether Redis looks stalled: a socket (of
// liveAddr's master, when set) has had a request pending for Timeout with
// no byte received since (see liveness), and keeps stallFrom current. b.mu
// is held.
func (b *batcher) stalledLocked() bool {
	if b.live == nil {
		return false
	}
	since, ok := b.live.stalledAt(b.liveAddr, b.timeout)
	if !ok {
		b.stallFrom, b.strikes = 0, 0
		return false
	}
	if s := int64(since.Sub(b.epoch)); s != b.stallFrom {
		b.stallFrom, b.strikes = s, 0
	}
	return true
}

// establishedLocked reports whether the stall stalledLocked last saw is
// established at now (ns since b.epoch): it has lasted b.establish, and no
// byte has been received from the master on any socket for b.establish.
// The silence counts from the last byte received, not from when the stall
// began, so a Redis frozen between two replies is stalled all the same.
// b.mu is held; call it after stalledLocked.
func (b *batcher) establishedLocked(now int64) bool {
	if b.establish <= 0 || b.stallFrom == 0 || now-b.stallFrom < int64(b.establish) {
		return false
	}
	return !b.live.heardSince(b.liveAddr, b.epoch.Add(time.Duration(now-int64(b.establish))))
}

// waitedOutLocked reports whether c, whose budget ran out at now while
// Redis looks stalled, has itself waited b.establish with nothing
// received from the master since it was queued. b.mu is held.
func (b *batcher) waitedOutLocked(c *scriptCall, now int64, stalled bool) bool {
	if !stalled || b.establish <= 0 || now-c.queued < int64(b.establish) {
		return false
	}
	return !b.live.heardSince(b.liveAddr, b.epoch.Add(time.Duration(c.queued)))
}

// budgetError is the error of a call whose budget ran out: ErrStalled
// once the stall is established, ErrCallTimeout while Redis looks stalled
// (stalledLocked), ErrDeadline otherwise.
func budgetError(stalled, established bool) error {
	switch {
	case stalled && established:
		return ErrStalled
	case stalled:
		return ErrCallTimeout
	}
	return ErrDeadline
}

// sweepLocked completes the calls of cs whose budget is at or before now
// (with budgetError), those that have waited a Timeout while the stall is
// established (with ErrStalled), or every pending call of cs when open
// (with the circuit's error, ErrCircuitOpen or ErrStalledOpen), and
// returns how many are still pending. b.mu is held.
func (b *batcher) sweepLocked(cs []*scriptCall, now int64, open error, stalled, established bool) int {
	pending := 0
	for _, c := range cs {
		if c.state.Load() != callPending {
			continue
		}
		var err error
		switch {
		case open != nil:
			err = open
		case c.deadline <= now:
			err = budgetError(stalled, established || b.waitedOutLocked(c, now, stalled))
		case established && now-c.queued >= int64(b.timeout):
			err = ErrStalled
		default:
			pending++
			continue
		}
		if c.claim() {
			c.finish(0, err)
		}
	}
	return pending
}
