// Package lease decides leased limits (a rate_limit's consistency:
// leased) at the instance: each instance holds units it leased from the
// store in advance, decides from them with no store round trip, and
// renews them in the background before they run out.
//
// A lease is charged up front by one atomic store operation
// (algo.LeaseRequest: the memory store under its lock, Redis with one
// script): min(want, what remains of the limit). So the units every
// instance holds or used never sum to more than the limit, whatever the
// instances do: over-admission is 0 by construction, and the price is
// under-admission, bounded by the units instances hold and do not use.
// Units an instance holds beyond its share go back to the store at its
// next renewal; the units of an instance that dies are simply not used.
//
// How much each instance asks for comes from pkg/fairshare: each lease
// operation records the instance's demand (units asked for over its last
// interval) in the store and returns every instance's, so all instances
// divide what remains of the limit the same way, max-min fair by demand.
//
// When the store fails, the units in hand are used up; then the hit is
// reported failed and the rule's failure_mode applies (pkg/service).
package lease

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/fairshare"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
)

// Store is a store that charges leases: the memory and Redis stores.
type Store interface {
	// Lease does req atomically (see algo.LeaseRequest).
	Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error)
}

// Options configure a Leaser.
type Options struct {
	// Store charges and takes back the leases.
	Store Store
	// Subscriber identifies this instance among those sharing the store;
	// 0 draws a random one in [1, 2^52).
	Subscriber int64
	// Interval is how often a lease is renewed and its size reconsidered
	// (0 means DefaultInterval; at least MinInterval); a limit whose
	// window is shorter than 4 intervals renews every quarter window.
	// Demand is measured per interval.
	Interval time.Duration
	// Timeout bounds one lease operation (0 means 1 s).
	Timeout time.Duration
	// Now is the clock every decision reads (nil means time.Now).
	Now func() time.Time
	// Ticker starts the renewal loop's ticks, every d of the clock Now
	// reads, and returns them and a function that stops them (nil means
	// a time.Ticker). A clock other than the real one needs its own, so
	// that renewals follow that clock.
	Ticker func(d time.Duration) (ticks <-chan time.Time, stop func())
	// Registerer receives the lease metrics; nil disables them.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultInterval is Options.Interval's default.
const DefaultInterval = 100 * time.Millisecond

// MinInterval is the shortest Options.Interval: a renewal is a store round
// trip per active key, so a shorter interval would only load the store.
const MinInterval = time.Millisecond

// Validate reports every invalid field, joined, each a
// *opterr.FieldError: a nil Store; an Interval that is negative or
// shorter than MinInterval; a negative Timeout. Zero values are valid:
// they mean the defaults.
func (o Options) Validate() error {
	var errs []error
	bad := func(field string, v any, reason string) {
		errs = append(errs, &opterr.FieldError{Package: "lease", Field: field, Value: v, Reason: reason})
	}
	if o.Store == nil {
		bad("Store", o.Store, "required")
	}
	switch {
	case o.Interval < 0:
		bad("Interval", o.Interval, "must not be negative")
	case o.Interval > 0 && o.Interval < MinInterval:
		bad("Interval", o.Interval, "must be at least "+MinInterval.String()+" (0 means the default, "+DefaultInterval.String()+")")
	}
	if o.Timeout < 0 {
		bad("Timeout", o.Timeout, "must not be negative")
	}
	return errors.Join(errs...)
}

// Leaser decides hits of leased limits from the units this instance holds.
// It is safe for concurrent use. Close returns what it holds.
type Leaser struct {
	opt     Options
	sub     int64
	mu      sync.RWMutex
	entries map[string]*entry
	m       *metrics
	log     *slog.Logger
	stop    chan struct{}
	done    chan struct{}
	closed  atomic.Bool
	// offset estimates the store's clock less the local one (µs), from
	// above: each operation's store now less the local time it was sent
	// is at least the true offset (the store acts after the send); the
	// estimate follows the smallest of them at once and larger ones
	// slowly (clock drift), so a slow reply hardly moves it.
	offset     atomic.Int64
	offsetMu   sync.Mutex
	offsetSeen bool
	// lastErrLog limits store failure logs to one per second.
	lastErrLog atomic.Int64
}

// New returns a Leaser and starts its renewal loop.
func New(opt Options) (*Leaser, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.Interval == 0 {
		opt.Interval = DefaultInterval
	}
	if opt.Timeout == 0 {
		opt.Timeout = time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Ticker == nil {
		opt.Ticker = realTicker
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	sub := opt.Subscriber
	if sub <= 0 {
		sub = 1 + rand.Int64N(1<<52-1)
	}
	m, err := newMetrics(opt.Registerer)
	if err != nil {
		return nil, err
	}
	ls := &Leaser{opt: opt, sub: sub, entries: map[string]*entry{}, m: m, log: opt.Logger,
		stop: make(chan struct{}), done: make(chan struct{})}
	go ls.loop()
	return ls, nil
}

// realTicker is Options.Ticker's default: a time.Ticker.
func realTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// Subscriber is this instance's id among the subscribers of the store.
func (ls *Leaser) Subscriber() int64 { return ls.sub }

// entry is one key's lease at this instance.
type entry struct {
	ls  *Leaser
	key string
	// shape is the limit but its rate and burst (fixed for the entry);
	// rate and burst mirror l's for entryFor, which reads them unlocked.
	shape       algo.Limit
	rate, burst atomic.Int64
	l           algo.Limit // under mu
	interval    int64      // µs
	alloc       *fairshare.Allocator

	mu     sync.Mutex
	ws     int64 // window start (store clock, µs) of avail; 0 for a token bucket
	avail  int64 // units held
	target int64 // units to hold, from the last division
	// asked counts the units requested since since (admitted or not):
	// the demand; demand is the last full interval's.
	asked, demand, since int64
	remaining            int64 // the store's Remaining at the last grant
	remainingWS          int64 // the window of remaining
	demands              map[string]int64
	exhaustedUntil       int64 // no grant to ask for before (store clock, µs)
	renewing             bool
	// stalled: a hit's wait for the renewal in flight ran out (the
	// store is not answering); later hits do not wait for it.
	stalled   bool
	renewed   chan struct{} // closed when the renewal in flight ends
	lastRenew int64         // local µs
	lastUse   int64         // local µs
	failErr   error         // the last renewal's error; nil after a success
	failures  int           // renewals failed in a row
	renewWS   int64         // the window of the last renewal
	// behind: the last renewal's store was still in a window that has
	// ended here (the clock estimate runs ahead of the store's by up to
	// a request's latency), so its grant did not count.
	behind bool
}

// now is the local clock in µs.
func (ls *Leaser) now() int64 { return ls.opt.Now().UnixMicro() }

// interval returns the renewal interval of l in µs.
func (ls *Leaser) interval(l algo.Limit) int64 {
	iv := ls.opt.Interval.Microseconds()
	if l.Kind != algo.TokenBucket {
		iv = min(iv, max(l.Period.Microseconds()/4, 1))
	}
	return max(iv, 1)
}

// entryFor returns h's lease entry, made on first use. The key includes
// the limit: a config reload that changes the limit starts a new lease.
func (ls *Leaser) entryFor(h *algo.Hit) *entry {
	ls.mu.RLock()
	e := ls.entries[h.Key]
	ls.mu.RUnlock()
	if e != nil && e.shape == shapeOf(h.Limit) {
		if e.rate.Load() != h.Limit.Rate || e.burst.Load() != h.Limit.Burst {
			// The rate changed (a cell's allowance, a reload): the
			// lease and its units stay, the store enforces the new
			// rate, which may have room again.
			e.mu.Lock()
			e.l = h.Limit
			e.exhaustedUntil = 0
			e.rate.Store(h.Limit.Rate)
			e.burst.Store(h.Limit.Burst)
			e.mu.Unlock()
		}
		return e
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if e = ls.entries[h.Key]; e != nil && e.shape == shapeOf(h.Limit) {
		return e
	}
	floor := max(1, capacity(h.Limit)/64)
	e = &entry{ls: ls, key: h.Key, l: h.Limit, shape: shapeOf(h.Limit), interval: ls.interval(h.Limit),
		alloc: fairshare.New(fairshare.Options{Floor: floor}), since: ls.now(), remaining: -1}
	e.rate.Store(h.Limit.Rate)
	e.burst.Store(h.Limit.Burst)
	ls.entries[h.Key] = e
	return e
}

// shapeOf is l without its rate and burst.
func shapeOf(l algo.Limit) algo.Limit {
	l.Rate, l.Burst = 0, 0
	return l
}

func capacity(l algo.Limit) int64 {
	if l.Kind == algo.TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}
