package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// mayRenew reports whether a renewal may start now: none is in flight,
// the store has units to give, and after two failures in a row an
// interval passed (one failure is retried at once: a single slow reply
// of a loaded store is not an outage).
func (e *entry) mayRenew(t, lt int64) bool {
	if e.renewing || t < e.exhaustedUntil {
		return false
	}
	return e.failures < 2 || lt-e.lastRenew >= e.interval
}

// startRenew plans a lease operation and runs it in the background
// (e.mu held). The instance asks for its share of what remains — its own
// units plus the store's remainder — divided max-min fairly by the
// demands the store reported, its own being the larger of the last
// interval's and the current one's. Units held beyond the share go back
// in the same operation.
func (e *entry) startRenew(t, lt int64) {
	ls := e.ls
	e.renewing = true
	e.renewWS = e.ws
	e.renewed = make(chan struct{})
	demand := max(e.demand, e.asked)
	me := strconv.FormatInt(ls.sub, 10)
	demands := make(map[string]int64, len(e.demands)+1)
	for id, d := range e.demands {
		demands[id] = d
	}
	demands[me] = demand
	pool := capacity(e.l)
	if e.remaining >= 0 && (e.l.Kind == algo.TokenBucket || e.remainingWS == e.ws) {
		pool = e.remaining
	}
	pool += e.avail
	share := e.alloc.Allocate(time.UnixMicro(lt), pool, demands)[me]
	e.target = share
	req := algo.LeaseRequest{Key: e.key, Limit: e.l, Subscriber: ls.sub, Demand: demand,
		ReturnWindow: e.ws, Stale: 4 * e.interval}
	switch {
	case share > e.avail:
		req.Want = share - e.avail
	case e.avail == 0:
		// The division left nothing for this instance, from what the
		// store said last; ask for the floor: the store decides.
		req.Want = max(1, capacity(e.l)/64)
	case e.avail > 2*share+1:
		// Well above the share: give back what is beyond it.
		req.Return = e.avail - share
		e.avail = share
	}
	go e.renew(req)
}

// renew does req and applies the grant (see startRenew). A renewal that
// ends after Close began gives its units back itself: Close waits for
// renewals in flight only as long as its context allows.
func (e *entry) renew(req algo.LeaseRequest) {
	e.apply(req)
	if e.ls.closed.Load() {
		e.giveBack(context.Background())
	}
}

// apply does req and applies the grant to e.
func (e *entry) apply(req algo.LeaseRequest) {
	ls := e.ls
	ctx, cancel := context.WithTimeout(context.Background(), ls.opt.Timeout)
	sent := ls.now()
	g, err := ls.opt.Store.Lease(ctx, req)
	cancel()
	lt := ls.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastRenew = lt
	e.renewing, e.stalled = false, false
	defer close(e.renewed)
	if err != nil {
		e.failErr = err
		e.failures++
		ls.m.renewed("error", 0, 0)
		ls.logFailure(err)
		return
	}
	e.failErr, e.failures = nil, 0
	ls.observeOffset(g.Now - sent)
	granted := g.Granted
	if e.l.Kind != algo.TokenBucket {
		p := e.l.Period.Microseconds()
		gws := g.Now - g.Now%p
		if gws > e.ws {
			e.ws, e.avail = gws, 0
		}
		e.behind = gws < e.ws
		if e.behind { // granted in a window that has ended here
			granted = 0
		}
		e.remainingWS = gws
	}
	e.avail += granted
	e.remaining = g.Remaining
	e.demands = make(map[string]int64, len(g.Demands))
	for _, d := range g.Demands {
		e.demands[strconv.FormatInt(d.Subscriber, 10)] = d.Demand
	}
	e.exhaustedUntil = 0
	if g.Remaining == 0 && e.avail == 0 {
		e.exhaustedUntil = g.Now + e.interval
		if e.l.Kind == algo.FixedWindow {
			p := e.l.Period.Microseconds()
			e.exhaustedUntil = g.Now - g.Now%p + p
		}
	}
	result := "granted"
	switch {
	case req.Want > 0 && g.Granted == 0:
		result = "empty"
	case g.Granted < req.Want:
		result = "short"
	}
	ls.m.renewed(result, g.Granted, req.Return)
	if ls.log.Enabled(context.Background(), slog.LevelDebug) {
		// The key may hold request values: it is logged hashed.
		sum := sha256.Sum256([]byte(e.key))
		ls.log.Debug("lease: renewed", "key_hash", hex.EncodeToString(sum[:8]), "result", result,
			"asked", req.Want, "granted", g.Granted, "returned", req.Return, "held", e.avail,
			"remaining", g.Remaining, "demand", req.Demand, "subscribers", len(g.Demands))
	}
}

// observeOffset updates the clock offset estimate with a sample (see
// Leaser.offset).
func (ls *Leaser) observeOffset(s int64) {
	ls.offsetMu.Lock()
	defer ls.offsetMu.Unlock()
	cur := ls.offset.Load()
	switch {
	case !ls.offsetSeen || s <= cur:
		ls.offsetSeen = true
		ls.offset.Store(s)
	default:
		ls.offset.Store(cur + (s-cur)/64)
	}
}

// logFailure logs a failed lease operation, at most once a second.
func (ls *Leaser) logFailure(err error) {
	now := time.Now().UnixNano()
	last := ls.lastErrLog.Load()
	if now-last < int64(time.Second) || !ls.lastErrLog.CompareAndSwap(last, now) {
		return
	}
	ls.log.Warn("lease: renewal failed; deciding from the units in hand, then the rules' failure_mode", "error", err.Error())
}

// loop runs renewDue every half interval (Options.Ticker).
func (ls *Leaser) loop() {
	defer close(ls.done)
	ticks, stop := ls.opt.Ticker(max(ls.opt.Interval/2, time.Millisecond))
	defer stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-ticks:
		}
		ls.renewDue()
	}
}

// renewDue renews the active leases whose interval has passed (shares
// demand, gives back units beyond the share, fetches what regrew) and
// drops the idle ones, giving their units back.
func (ls *Leaser) renewDue() {
	ls.mu.Lock()
	var idle []*entry
	for k, e := range ls.entries {
		e.mu.Lock()
		lt := ls.now()
		t := lt + ls.offset.Load()
		switch {
		case lt-e.lastUse > 8*e.interval && !e.renewing:
			delete(ls.entries, k)
			idle = append(idle, e)
		case lt-e.lastRenew >= e.interval && e.mayRenew(t, lt):
			// The first lease of a window is a hit's: it carries
			// the limit in force (a cell's allowance may differ
			// from the last window's).
			if e.roll(t, lt); e.renewWS == e.ws {
				e.startRenew(t, lt)
			}
		}
		e.mu.Unlock()
	}
	ls.mu.Unlock()
	for _, e := range idle {
		e.giveBack(context.Background())
	}
}

// giveBack returns the units e holds to the store (an idle or closing
// lease); a failure leaves them charged until the window ends.
func (e *entry) giveBack(ctx context.Context) {
	e.mu.Lock()
	n, ws, l := e.avail, e.ws, e.l
	e.avail = 0
	e.mu.Unlock()
	if n <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.ls.opt.Timeout)
	defer cancel()
	_, err := e.ls.opt.Store.Lease(ctx, algo.LeaseRequest{Key: e.key, Limit: l, Subscriber: e.ls.sub,
		Return: n, ReturnWindow: ws, Stale: 4 * e.interval})
	if err != nil {
		e.ls.m.renewed("error", 0, 0)
		return
	}
	e.ls.m.renewed("returned", 0, n)
}

// Close stops the renewals and gives back every lease's units, waiting
// (until ctx ends) for the renewals in flight so that their grants go
// back too; one that ends later gives its grant back on its own.
func (ls *Leaser) Close(ctx context.Context) error {
	if ls.closed.Swap(true) {
		return nil
	}
	close(ls.stop)
	<-ls.done
	ls.mu.Lock()
	es := make([]*entry, 0, len(ls.entries))
	for _, e := range ls.entries {
		es = append(es, e)
	}
	ls.entries = map[string]*entry{}
	ls.mu.Unlock()
	for _, e := range es {
		e.mu.Lock()
		ch := e.renewed
		renewing := e.renewing
		e.mu.Unlock()
		if renewing {
			select {
			case <-ch:
			case <-ctx.Done():
			}
		}
		e.giveBack(ctx)
	}
	return nil
}
