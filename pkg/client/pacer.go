// Package client paces a Go program's outbound calls to a third-party API
// that publishes rate limits, so that the program stays under them instead
// of collecting 429s.
//
// A Pacer asks a Limiter before each call: an in-process token bucket from
// pkg/algo (NewLocal) or a ratelimitd shared by many processes over gRPC
// (NewRemote). Callers wait in a bounded FIFO queue until the Limiter
// admits them or their context ends. Responses feed the Pacer (Observe, or
// the Transport wrapper): Retry-After holds every caller until it passes,
// with jitter, and RateLimit or X-RateLimit-* fields cap the calls sent
// before the upstream's window resets, less a safety margin.
package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrQueueFull is returned by Wait when MaxQueue callers are already waiting.
var ErrQueueFull = errors.New("client: pacing queue is full")

// ErrNegativeCost is returned by Wait for a cost below 0.
var ErrNegativeCost = errors.New("client: negative cost")

// Limiter decides whether a call of cost units may go now.
type Limiter interface {
	// Take asks for cost units at now. It reports ok, or how long to wait
	// before asking again.
	Take(ctx context.Context, now time.Time, cost int64) (ok bool, wait time.Duration, err error)
}

// Options configure a Pacer.
type Options struct {
	// Limiter admits calls; required.
	Limiter Limiter
	// MaxQueue bounds the callers waiting at once; more fail with
	// ErrQueueFull. Default 1024.
	MaxQueue int
	// Margin is the share of an upstream-advertised remaining quota left
	// unused (rounded down, so a small remainder is used whole), to absorb
	// other clients of the same quota and clock drift; calls in flight are
	// subtracted as well. Default 0.1; negative means 0.
	Margin float64
	// Jitter is the largest extra wait added to a Retry-After or a reset,
	// as a share of it, so that paced clients do not return together.
	// Default 0.1; negative means 0.
	Jitter float64
	// MaxWait caps one wait the Limiter or the upstream asks for, so that a
	// bad header cannot park callers for days. Default 1 h.
	MaxWait time.Duration
}

// Pacer queues calls and releases them as the Limiter and the upstream's
// own headers allow. It is safe for concurrent use.
type Pacer struct {
	opt Options

	mu        sync.Mutex
	queue     []chan struct{} // waiters in arrival order; queue[0] may ask the Limiter
	inFlight  int             // calls released and not yet observed
	holdTill  time.Time       // no call before this (Retry-After, spent upstream quota)
	gate      int64           // calls left before gateEnd, by the upstream's count; -1 none
	gateEnd   time.Time       // the upstream's window ends by then (the tightest bound its answers gave)
	gateR     int64           // the upstream's remaining count in the answer that last set the gate
	gateQuota string          // and the name of the quota it came from (RateLimit's item; "" for X-RateLimit-*)
	gateSeq   uint64          // released when the gate was last set from an answer
	gateMark  uint64          // units answered before that answer's call was released, plus its own; 0 unknown
	released  uint64          // calls released so far; a call's ticket is its number
	sent      uint64          // units released so far (a call of cost 0 counts 1)
	answered  uint64          // units whose answers Transport has seen so far
	reopen    chan struct{}   // signalled when an answer may reopen the gate
}

// ticket identifies a call released by wait, for observe: its number, its
// units, and the units answered when it was released.
type ticket struct {
	seq, units, mark uint64
}

// New returns a Pacer. It panics when opt.Limiter is nil.
func New(opt Options) *Pacer {
	if opt.Limiter == nil {
		panic("client: Options.Limiter is nil")
	}
	if opt.MaxQueue <= 0 {
		opt.MaxQueue = 1024
	}
	if opt.Margin == 0 {
		opt.Margin = 0.1
	}
	opt.Margin = min(max(opt.Margin, 0), 0.9)
	if opt.Jitter == 0 {
		opt.Jitter = 0.1
	}
	opt.Jitter = max(opt.Jitter, 0)
	if opt.MaxWait <= 0 {
		opt.MaxWait = time.Hour
	}
	return &Pacer{opt: opt, gate: -1, reopen: make(chan struct{}, 1)}
}

// Wait blocks until a call of cost units may go, and counts it in flight
// until Done or Observe. It returns ctx's error if ctx ends first,
// ErrQueueFull when the queue is full, ErrNegativeCost, or the Limiter's
// error (ErrCostOverBurst for a cost a Local bucket can never admit); the
// callers queued behind then go on.
func (p *Pacer) Wait(ctx context.Context, cost int64) error {
	_, err := p.wait(ctx, cost)
	return err
}

// wait is Wait, and returns the released call's ticket for observe.
func (p *Pacer) wait(ctx context.Context, cost int64) (ticket, error) {
	if cost < 0 {
		return ticket{}, ErrNegativeCost
	}
	me := make(chan struct{}, 1)
	p.mu.Lock()
	if len(p.queue) >= p.opt.MaxQueue {
		p.mu.Unlock()
		return ticket{}, ErrQueueFull
	}
	p.queue = append(p.queue, me)
	if len(p.queue) == 1 {
		me <- struct{}{}
	}
	p.mu.Unlock()
	defer p.leave(me)

	select { // wait for our turn at the head of the queue
	case <-me:
	case <-ctx.Done():
		return ticket{}, ctx.Err()
	}
	for {
		tk, wait, gated, err := p.try(ctx, cost)
		if err != nil || wait == 0 {
			return tk, err
		}
		// The gate waits for the upstream's reset, but the answer to a call
		// in flight may reopen it sooner; a Limiter's wait is its own.
		var reopen <-chan struct{}
		if gated {
			reopen = p.reopen
		}
		if err := sleep(ctx, min(wait, p.opt.MaxWait), reopen); err != nil {
			return ticket{}, err
		}
	}
}

// try asks the upstream's gate and then the Limiter; on success the call is
// in flight. It returns the call's ticket when admitted, else the wait
// before the next try and whether the gate (rather than a hold or the
// Limiter) asked for it.
func (p *Pacer) try(ctx context.Context, cost int64) (ticket, time.Duration, bool, error) {
	now := time.Now()
	p.mu.Lock()
	if d := p.holdTill.Sub(now); d > 0 {
		p.mu.Unlock()
		return ticket{}, d, false, nil
	}
	if p.gate >= 0 && now.Before(p.gateEnd) && p.gate < max(cost, 1) {
		d := p.gateEnd.Sub(now)
		select { // drop a stale signal: only answers from now on count
		case <-p.reopen:
		default:
		}
		p.mu.Unlock()
		return ticket{}, d, true, nil
	}
	p.mu.Unlock()

	ok, wait, err := p.opt.Limiter.Take(ctx, now, cost)
	if err != nil {
		return ticket{}, 0, false, err
	}
	if !ok {
		return ticket{}, max(wait, time.Millisecond), false, nil
	}
	p.mu.Lock()
	p.inFlight++
	p.released++
	units := uint64(max(cost, 1))
	p.sent += units
	tk := ticket{seq: p.released, units: units, mark: p.answered}
	if p.gate >= 0 {
		p.gate = max(p.gate-max(cost, 1), 0)
	}
	p.mu.Unlock()
	return tk, 0, false, nil
}

// leave removes me from the queue and hands the head to the next waiter.
func (p *Pacer) leave(me chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.queue {
		if c == me {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			if i == 0 && len(p.queue) > 0 {
				p.queue[0] <- struct{}{}
			}
			return
		}
	}
}

// Done ends a call released by Wait that got no response to Observe (a
// transport error): it is no longer in flight.
func (p *Pacer) Done() {
	// The call may still reach the upstream, so it does not count as
	// answered (see sameWindow).
	p.mu.Lock()
	p.inFlight = max(p.inFlight-1, 0)
	p.mu.Unlock()
}

// sleep waits d, or until wake is signalled (a nil wake never is), or until
// ctx ends.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
