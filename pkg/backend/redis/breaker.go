package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// BreakerState is the state of a circuit breaker.
type BreakerState int

const (
	// BreakerClosed: calls go to Redis.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail immediately with ErrCircuitOpen.
	BreakerOpen
	// BreakerHalfOpen: OpenFor has passed; one probe call at a time goes to
	// Redis, the others fail immediately. A successful probe closes the
	// circuit, a failed one opens it again.
	BreakerHalfOpen
)

// String is the metric label: "closed", "open" or "half_open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// Defaults of DefaultBreakerOptions.
const (
	DefaultBreakerFailures     = 5
	DefaultBreakerWindow       = time.Second
	DefaultBreakerMinCalls     = 20
	DefaultBreakerFailureRatio = 0.5
	DefaultBreakerOpenFor      = 250 * time.Millisecond
)

// BreakerOptions configure a Breaker. Only outage errors (Error.Outage:
// timeout, refused, loading, clusterdown, unknown connection errors) count
// as failures; replies from a live server (OOM, READONLY, auth, script
// errors) and caller cancellations do not.
type BreakerOptions struct {
	// Failures consecutive failures open the circuit (>= 1).
	Failures int
	// Window is the sliding window of the failure ratio rule (>= 10 ms).
	Window time.Duration
	// MinCalls is the minimum of calls within Window before FailureRatio
	// applies (>= 1).
	MinCalls int
	// FailureRatio of failed calls within Window (when at least MinCalls)
	// opens the circuit; in (0, 1].
	FailureRatio float64
	// OpenFor is how long the circuit stays open before a half-open probe
	// (> 0). With Redis back, normal answers resume within OpenFor plus
	// go-redis' 1 s reconnect probe.
	OpenFor time.Duration
	// Disabled turns the breaker off: every call goes to Redis.
	Disabled bool
}

// DefaultBreakerOptions: open after 5 consecutive failures or >= 50% failed
// of >= 20 calls within 1 s; probe after 250 ms.
func DefaultBreakerOptions() BreakerOptions {
	return BreakerOptions{
		Failures:     DefaultBreakerFailures,
		Window:       DefaultBreakerWindow,
		MinCalls:     DefaultBreakerMinCalls,
		FailureRatio: DefaultBreakerFailureRatio,
		OpenFor:      DefaultBreakerOpenFor,
	}
}

// Validate reports every out-of-range field, joined.
func (o BreakerOptions) Validate() error {
	if o.Disabled {
		return nil
	}
	var errs []error
	if o.Failures < 1 {
		errs = append(errs, fmt.Errorf("redis: breaker failures must be at least 1, got %d", o.Failures))
	}
	if o.Window < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("redis: breaker window must be at least 10ms, got %v", o.Window))
	}
	if o.MinCalls < 1 {
		errs = append(errs, fmt.Errorf("redis: breaker min calls must be at least 1, got %d", o.MinCalls))
	}
	if !(o.FailureRatio > 0 && o.FailureRatio <= 1) {
		errs = append(errs, fmt.Errorf("redis: breaker failure ratio must be in (0, 1], got %v", o.FailureRatio))
	}
	if o.OpenFor <= 0 {
		errs = append(errs, fmt.Errorf("redis: breaker open-for must be positive, got %v", o.OpenFor))
	}
	return errors.Join(errs...)
}

const breakerBuckets = 10

type breakerBucket struct {
	epoch         int64 // bucket index in time (UnixNano / width)
	calls, failed int
}

// Breaker is a circuit breaker: it stops calls to a Redis that keeps
// failing so that no request waits on it, and probes it again after
// OpenFor. The pure methods (Allow, Record, StateAt) take the time as an
// argument; Do and Healthy read the breaker's clock. Safe for concurrent
// use. The zero value is not usable; use NewBreaker.
type Breaker struct {
	opts  BreakerOptions
	now   func() time.Time
	width int64 // bucket width in ns

	mu          sync.Mutex
	state       BreakerState // closed or open; half-open is derived
	openedAt    time.Time
	probing     bool      // a half-open probe is in flight
	probeAt     time.Time // when the probe was allowed
	consecutive int
	lastFailAt  time.Time // when the last failure counted in consecutive was recorded
	buckets     [breakerBuckets]breakerBucket
	opened      uint64 // times the circuit opened
}

// NewBreaker returns a closed breaker. now is its clock for Do and Healthy
// (nil: time.Now). o must be valid (see BreakerOptions.Validate).
func NewBreaker(o BreakerOptions, now func() time.Time) *Breaker {
	if now == nil {
		now = time.Now
	}
	w := int64(o.Window) / breakerBuckets
	if w <= 0 {
		w = 1
	}
	return &Breaker{opts: o, now: now, width: w}
}

// Allow reports whether a call may go to Redis at now: nil, or
// ErrCircuitOpen while the circuit is open or a half-open probe is in
// flight. Every allowed call must be followed by exactly one Record.
func (b *Breaker) Allow(now time.Time) error {
	if b.opts.Disabled {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.stateLocked(now) {
	case BreakerClosed:
		return nil
	case BreakerHalfOpen:
		// One probe at a time; a probe that never recorded (lost) is
		// replaced after another OpenFor.
		if !b.probing || now.Sub(b.probeAt) >= b.opts.OpenFor {
			b.probing, b.probeAt = true, now
			return nil
		}
	}
	return ErrCircuitOpen
}

// Record reports the outcome of an allowed call that ended at now. err is
// classified (Classify); only outage errors count as failures, and
// cancellations by the caller count as nothing.
func (b *Breaker) Record(now time.Time, err error) { b.record(now, now, err) }

// record is Record for a call that started at start. A failed call that
// was already in flight when the previous failure was recorded waited on
// the same stall: it counts for the failure ratio but not as another
// consecutive failure (otherwise N concurrent calls timing out together on
// one brief stall would open the circuit at once).
func (b *Breaker) record(start, now time.Time, err error) {
	if b.opts.Disabled {
		return
	}
	failed, neutral := false, false
	if err != nil {
		var e *Error
		errors.As(Classify(err), &e) // always true for err != nil
		failed = e.outage
		neutral = e.cause == CauseCanceled || e.cause == CauseCircuitOpen
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.stateLocked(now)
	if st == BreakerHalfOpen {
		b.probing = false
		switch {
		case neutral:
		case failed:
			b.openLocked(now)
		default:
			b.closeLocked()
		}
		return
	}
	if st == BreakerOpen || neutral {
		// Stragglers that started before the circuit opened.
		return
	}
	bk := b.bucketLocked(now)
	bk.calls++
	if !failed {
		b.consecutive = 0
		return
	}
	bk.failed++
	if !start.Before(b.lastFailAt) {
		b.consecutive++
		b.lastFailAt = now
	}
	if b.consecutive >= b.opts.Failures {
		b.openLocked(now)
		return
	}
	calls, fails := b.windowLocked(now)
	if calls >= b.opts.MinCalls && float64(fails) >= b.opts.FailureRatio*float64(calls) {
		b.openLocked(now)
	}
}

// StateAt is the state at now (open turns half-open OpenFor after opening).
func (b *Breaker) StateAt(now time.Time) BreakerState {
	if b.opts.Disabled {
		return BreakerClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stateLocked(now)
}

// State is the state now, by the breaker's clock (for a metrics gauge).
func (b *Breaker) State() BreakerState { return b.StateAt(b.now()) }

// Healthy reports whether the circuit is closed now: the backend is
// answering (for /healthcheck and gRPC health).
func (b *Breaker) Healthy() bool { return b.State() == BreakerClosed }

// Opened is how many times the circuit has opened since NewBreaker.
func (b *Breaker) Opened() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

// Do runs fn under the breaker: while the circuit is open it returns
// ErrCircuitOpen without calling fn; otherwise it calls fn with ctx bounded
// by timeout (when > 0), records the outcome and returns fn's error
// classified (an *Error with a Cause), or nil.
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
	err := Classify(fn(ctx))
	b.record(start, b.now(), err)
	return err
}

func (b *Breaker) stateLocked(now time.Time) BreakerState {
	if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.opts.OpenFor {
		return BreakerHalfOpen
	}
	return b.state
}

func (b *Breaker) openLocked(now time.Time) {
	b.state, b.openedAt, b.probing = BreakerOpen, now, false
	b.opened++
}

func (b *Breaker) closeLocked() {
	b.state, b.consecutive, b.probing = BreakerClosed, 0, false
	b.buckets = [breakerBuckets]breakerBucket{}
}

func (b *Breaker) bucketLocked(now time.Time) *breakerBucket {
	epoch := now.UnixNano() / b.width
	bk := &b.buckets[uint64(epoch)%breakerBuckets]
	if bk.epoch != epoch {
		*bk = breakerBucket{epoch: epoch}
	}
	return bk
}

// windowLocked sums the buckets within Window of now.
func (b *Breaker) windowLocked(now time.Time) (calls, failed int) {
	cur := now.UnixNano() / b.width
	for i := range b.buckets {
		bk := &b.buckets[i]
		if bk.epoch > cur-breakerBuckets && bk.epoch <= cur {
			calls += bk.calls
			failed += bk.failed
		}
	}
	return calls, failed
}
