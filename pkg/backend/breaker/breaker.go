// Package breaker is the circuit breaker of the network backends (Redis,
// memcached): it stops calls to a backend that keeps failing, so that no
// request waits on it, and probes it again after OpenFor. It tells a
// circuit opened by stalls alone (timeouts: a frozen backend and a very
// slow one look the same) from one opened by failures the backend proved
// (refused connections, ...): the backend's Errors say which error each
// refuses calls with, and how a call's error counts (Outcome).
package breaker

// The breaker is written here rather than taken from a library
// (sony/gobreaker, failsafe-go) because it needs an injected clock, FailFor
// for timeouts next to an immediate opening on proven failures, stragglers
// that count for nothing, replacement of lost probes, and callbacks run
// outside its lock.

import (
	"context"
	"sync"
	"time"
)

const breakerBuckets = 10

type breakerBucket struct {
	epoch         int64 // bucket index in time (UnixNano / width)
	calls, failed int
	firstFail     int64 // UnixNano of the bucket's first failure
}

// Breaker is the circuit breaker of one backend. Allow, Record and StateAt
// take the time as an argument; Do, State and Healthy read the breaker's
// clock. It is safe for concurrent use; create one with New.
type Breaker struct {
	opts  Options
	errs  Errors
	now   func() time.Time
	width int64 // bucket width in ns

	mu          sync.Mutex
	state       State // closed or open; half-open is derived
	openedAt    time.Time
	probes      int       // half-open probes in flight
	probeAt     time.Time // when the latest probe was allowed
	consecutive int
	streakStart time.Time // when the first of the consecutive failures was recorded
	streakHard  bool      // the consecutive failures include a non-timeout outage
	openHard    bool      // the circuit opened on failures that include a non-timeout outage
	// lostAt is when the latest connection loss (Dropped) was counted:
	// a drop of a call that started before it is the same loss.
	// losses are the losses counted since lossStart, within Window.
	lostAt    time.Time
	lossStart time.Time
	losses    int
	buckets   [breakerBuckets]breakerBucket
	opened    uint64 // times the circuit opened
	// halfOpened: HalfOpen was reported since the circuit last
	// opened; pending are the transitions unlock reports.
	halfOpened bool
	pending    []State
	// outageSince is when the circuit last opened from closed;
	// failedProbes counts the reopenings since; reported is when
	// OnReport was last called; reports are the reports unlock makes.
	outageSince  time.Time
	failedProbes int
	reported     time.Time
	reports      []Report
}

// unlock releases b.mu and then reports the transitions recorded while it
// was held to OnTransition.
func (b *Breaker) unlock() {
	p, r := b.pending, b.reports
	b.pending, b.reports = nil, nil
	b.mu.Unlock()
	if b.opts.OnTransition != nil {
		for _, st := range p {
			b.opts.OnTransition(st)
		}
	}
	if b.opts.OnReport != nil {
		for _, rp := range r {
			b.opts.OnReport(rp)
		}
	}
}

// reportLocked records a report for unlock: always for a circuit that
// opened from closed or closed (every false), else (still open) only
// ReportEvery after the previous one. b.mu is held.
func (b *Breaker) reportLocked(now time.Time, r Report, every bool) {
	if b.opts.OnReport == nil {
		return
	}
	if every {
		e := b.opts.ReportEvery
		if e <= 0 {
			e = DefaultReportEvery
		}
		if now.Sub(b.reported) < e {
			return
		}
	}
	b.reported = now
	b.reports = append(b.reports, r)
}

// transitionLocked records a state change for unlock. b.mu is held.
func (b *Breaker) transitionLocked(to State) {
	if b.opts.OnTransition != nil {
		b.pending = append(b.pending, to)
	}
}

// New returns a closed breaker. errs says how it reads and refuses calls;
// now is its clock for Do, State and Healthy (nil: time.Now). o must be
// valid (see Options.Validate).
func New(o Options, errs Errors, now func() time.Time) *Breaker {
	if now == nil {
		now = time.Now
	}
	w := int64(o.Window) / breakerBuckets
	if w <= 0 {
		w = 1
	}
	return &Breaker{opts: o, errs: errs, now: now, width: w}
}

// Allow reports whether a call may go to the backend at now: nil, or the
// refusal (see OpenErr) while the circuit is open or Probes half-open
// probes are in flight. Every allowed call must be followed by exactly one Record.
func (b *Breaker) Allow(now time.Time) error {
	if b.opts.Disabled {
		return nil
	}
	b.mu.Lock()
	defer b.unlock()
	switch b.stateLocked(now) {
	case Closed:
		return nil
	case HalfOpen:
		if !b.halfOpened {
			b.halfOpened = true
			b.transitionLocked(HalfOpen)
		}
		// Probes that never recorded (lost) are replaced after another
		// OpenFor.
		if b.probes > 0 && now.Sub(b.probeAt) >= b.opts.OpenFor {
			b.probes = 0
		}
		if b.probes < max(1, b.opts.Probes) {
			b.probes++
			b.probeAt = now
			return nil
		}
	}
	return b.openErrLocked()
}

// openErrLocked is the error of a call refused by the open circuit:
// Errors.Open when proven failures opened it, Errors.StalledOpen when only
// stalls (timeouts) did. b.mu is held.
func (b *Breaker) openErrLocked() error {
	if b.openHard {
		return b.errs.Open
	}
	return b.errs.StalledOpen
}

// OpenErr is nil unless the circuit is open at now, and then the error of
// a call it refuses (see openErrLocked).
func (b *Breaker) OpenErr(now time.Time) error {
	if b.opts.Disabled {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stateLocked(now) != Open {
		return nil
	}
	return b.openErrLocked()
}

// Record reports the outcome of an allowed call that ended at now (see
// Outcome: nil is Answered).
func (b *Breaker) Record(now time.Time, err error) { b.RecordSince(now, now, err) }

// RecordSince is Record for a call that started at start: a call that
// started before the circuit last opened is a straggler and counts for
// nothing.
func (b *Breaker) RecordSince(start, now time.Time, err error) {
	if b.opts.Disabled {
		return
	}
	outcome := Answered
	if err != nil {
		outcome = b.errs.Outcome(err)
	}
	failed, neutral, hard := outcome >= Stalled, outcome == Neutral, outcome >= Failed
	b.mu.Lock()
	defer b.unlock()
	st := b.stateLocked(now)
	if st != Closed && start.Before(b.openedAt) {
		// A straggler that started before the circuit opened.
		return
	}
	if st == HalfOpen {
		// A probe.
		b.probes = max(0, b.probes-1)
		switch {
		case neutral:
		case failed:
			if b.probes == 0 {
				b.openLocked(now, hard, err)
			}
		default:
			b.closeLocked(now)
		}
		return
	}
	if st == Open || neutral {
		return
	}
	if outcome == Dropped {
		b.dropLocked(start, now, err)
		return
	}
	bk := b.bucketLocked(now)
	bk.calls++
	if !failed {
		b.consecutive = 0
		return
	}
	b.failLocked(bk, now, hard, err)
}

// dropLocked records a call, started at start, whose connection was lost
// at now (Dropped). Calls in flight when a loss was counted (started
// before lostAt) were on the lost connections: they count for nothing.
// Another loss counts as one failure that, like a stall, opens the
// circuit only with others (a refused dial makes the run proven), and
// Failures losses within Window open it at once. b.mu is held; the
// circuit is closed.
func (b *Breaker) dropLocked(start, now time.Time, err error) {
	if start.Before(b.lostAt) {
		return
	}
	b.lostAt = now
	if b.losses == 0 || now.Sub(b.lossStart) >= b.opts.Window {
		b.lossStart, b.losses = now, 0
	}
	b.losses++
	if b.losses >= b.opts.Failures {
		b.openLocked(now, true, err)
		return
	}
	bk := b.bucketLocked(now)
	bk.calls++
	b.failLocked(bk, now, false, err)
}

// Overdue records a stall for an invocation sent at sent that the
// backend has left unanswered until now (with no other reply since): the
// evidence of a frozen or black-holed backend while the calls riding the
// invocation still wait within their budgets. It counts only while the
// circuit is closed (a half-open probe reports its own outcome) and not
// for invocations sent before the circuit last opened.
func (b *Breaker) Overdue(sent, now time.Time) {
	if b.opts.Disabled {
		return
	}
	b.mu.Lock()
	defer b.unlock()
	if b.stateLocked(now) != Closed || sent.Before(b.openedAt) {
		return
	}
	bk := b.bucketLocked(now)
	bk.calls++
	b.failLocked(bk, now, false, nil)
}

// failLocked counts one failure (hard: not a timeout) ending at now in bk,
// of error err (nil: an unanswered invocation), and opens the circuit when
// a rule says so. b.mu is held; the circuit is closed.
func (b *Breaker) failLocked(bk *breakerBucket, now time.Time, hard bool, err error) {
	bk.failed++
	if bk.failed == 1 {
		bk.firstFail = now.UnixNano()
	}
	b.consecutive++
	if b.consecutive == 1 {
		b.streakStart, b.streakHard = now, false
	}
	b.streakHard = b.streakHard || hard
	if b.consecutive >= b.opts.Failures && (b.streakHard || now.Sub(b.streakStart) >= b.opts.FailFor) {
		b.openLocked(now, b.streakHard, err)
		return
	}
	calls, fails, first := b.windowLocked(now)
	if calls >= b.opts.MinCalls && float64(fails) >= b.opts.FailureRatio*float64(calls) &&
		now.UnixNano()-first >= int64(b.opts.FailFor) {
		b.openLocked(now, b.streakHard, err)
	}
}

// StateAt is the state at now (open turns half-open OpenFor after opening).
func (b *Breaker) StateAt(now time.Time) State {
	if b.opts.Disabled {
		return Closed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stateLocked(now)
}

// State is the state now, by the breaker's clock (for a metrics gauge).
func (b *Breaker) State() State { return b.StateAt(b.now()) }

// Now is the breaker's clock.
func (b *Breaker) Now() time.Time { return b.now() }

// Healthy reports whether the circuit is closed now: the backend is
// answering (for /healthcheck and gRPC health).
func (b *Breaker) Healthy() bool { return b.State() == Closed }

// Opened is how many times the circuit has opened since New.
func (b *Breaker) Opened() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

// Do runs fn under the breaker: while the circuit is open it returns the
// refusal (see OpenErr) without calling fn; otherwise it calls fn with ctx
// bounded by timeout (when > 0), records the outcome and returns fn's
// error.
func (b *Breaker) Do(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	if err := b.Allow(b.now()); err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	start := b.now()
	err := fn(ctx)
	b.RecordSince(start, b.now(), err)
	return err
}

func (b *Breaker) stateLocked(now time.Time) State {
	if b.state == Open && now.Sub(b.openedAt) >= b.opts.OpenFor {
		return HalfOpen
	}
	return b.state
}

// openLocked opens the circuit at now on a failure of error err (nil: an
// unanswered invocation); hard: the failures include one the backend
// proved. b.mu is held.
func (b *Breaker) openLocked(now time.Time, hard bool, err error) {
	if b.state == Closed {
		b.outageSince, b.failedProbes = now, 0
		b.reportLocked(now, Report{To: Open, Since: now, At: now, Stalled: !hard, Err: err}, false)
	} else {
		b.failedProbes++
		b.reportLocked(now, Report{To: Open, Still: true, FailedProbes: b.failedProbes, Since: b.outageSince, At: now, Stalled: !hard, Err: err}, true)
	}
	b.state, b.openedAt, b.probes, b.openHard = Open, now, 0, hard
	b.opened++
	b.halfOpened = false
	b.transitionLocked(Open)
}

func (b *Breaker) closeLocked(now time.Time) {
	b.reportLocked(now, Report{To: Closed, FailedProbes: b.failedProbes, Since: b.outageSince, At: now}, false)
	b.state, b.consecutive, b.probes, b.losses = Closed, 0, 0, 0
	b.buckets = [breakerBuckets]breakerBucket{}
	b.transitionLocked(Closed)
}

func (b *Breaker) bucketLocked(now time.Time) *breakerBucket {
	epoch := now.UnixNano() / b.width
	bk := &b.buckets[uint64(epoch)%breakerBuckets]
	if bk.epoch != epoch {
		*bk = breakerBucket{epoch: epoch}
	}
	return bk
}

// windowLocked sums the buckets within Window of now; first is the
// UnixNano of the earliest failure among them (now when none).
func (b *Breaker) windowLocked(now time.Time) (calls, failed int, first int64) {
	cur := now.UnixNano() / b.width
	first = now.UnixNano()
	for i := range b.buckets {
		bk := &b.buckets[i]
		if bk.epoch > cur-breakerBuckets && bk.epoch <= cur {
			calls += bk.calls
			failed += bk.failed
			if bk.failed > 0 && bk.firstFail < first {
				first = bk.firstFail
			}
		}
	}
	return calls, failed, first
}
