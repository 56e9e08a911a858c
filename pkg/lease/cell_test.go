package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// fakeClock is a clock the test steps.
type fakeClock struct{ us atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// noTicks is a Leaser's Ticker that never ticks: the test runs the
// renewal passes (renewDue) itself, on the fake clock.
func noTicks(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }

// lagged is the cells' Exchange: a report published at t (fake clock)
// reaches the other cells at t+delay.
type lagged struct {
	clk   *fakeClock
	delay time.Duration
	mu    sync.Mutex
	sent  []arrival
}

type arrival struct {
	at int64
	r  CellReport
}

func (x *lagged) Publish(r CellReport) {
	x.mu.Lock()
	x.sent = append(x.sent, arrival{x.clk.us.Load() + x.delay.Microseconds(), r})
	x.mu.Unlock()
}

func (x *lagged) Latest() []CellReport {
	now := x.clk.us.Load()
	x.mu.Lock()
	last := map[int64]CellReport{}
	for _, a := range x.sent {
		if a.at <= now {
			last[a.r.Cell] = a.r
		}
	}
	x.mu.Unlock()
	out := make([]CellReport, 0, len(last))
	for _, r := range last {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b CellReport) int { return int(a.Cell - b.Cell) })
	return out
}

// quiet waits until no renewal of ls is in flight (20 s at most: a
// renewal is one call to the store).
func quiet(t *testing.T, ls *Leaser) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		busy := false
		ls.mu.RLock()
		for _, e := range ls.entries {
			e.mu.Lock()
			busy = busy || e.renewing
			e.mu.Unlock()
		}
		ls.mu.RUnlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a renewal still in flight after 20 s")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// cellBound is the most the cells admit together in a window by the
// derivation in docs/leases.md: the budget (the limit less the headroom)
// plus, when reports lag by more than two Step intervals, (ceil(d/s) - 2)
// intervals of demand of every cell but the one with the least demand.
func cellBound(budget int64, delay, step time.Duration, demand []int64) int64 {
	steps := int64((delay + step - 1) / step) // ceil(d/s)
	var sum, least int64 = 0, demand[0]
	for _, d := range demand {
		sum += d
		least = min(least, d)
	}
	return budget + max(steps-2, 0)*(sum-least)
}

// TestCellsWithinHeadroom: three cells, each a redis-server with its own
// instance leasing from it, share one limit with a headroom of 15 %, under
// steady, uneven demand above the limit. The cells Step every interval s
// at staggered phases, and their reports reach each other d late. Each
// window's units admitted across the cells stay within the bound derived
// in docs/leases.md (cellBound): within the budget with d = s, and three
// intervals of the other cells' demand above it with d = 5s. A fake clock
// drives the Steps, the instances, the report delay and the servers' clock
// in the lease script (redis.Options.Now), so scheduling delays only make
// the test slower.
//
// The window is 20 intervals of a minute: the servers expire the window
// keys in real time, a window's remainder of the fake clock plus a second
// (pkg/backend/redis/lease.lua), so fake windows of 20 minutes keep every
// key the test still uses for at least a tick of fake time (6 s) plus a
// second.
func TestCellsWithinHeadroom(t *testing.T) {
	redistest.Require(t)
	const cells = 3
	srvs := make([]*redistest.Server, cells)
	for i := range srvs {
		srvs[i] = redistest.Standalone(t)
	}
	for _, delay := range []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute} {
		t.Run(fmt.Sprintf("delay=%v", delay), func(t *testing.T) { cellsRun(t, srvs, delay) })
	}
}

func cellsRun(t *testing.T, srvs []*redistest.Server, delay time.Duration) {
	const (
		headroom = 0.15
		step     = time.Minute // s: the cells' Step interval
		tick     = step / 10
		period   = 20 * step
		windows  = 5 // the first one warms up: no cell has reported yet
		workers  = 4 // concurrent callers per cell
	)
	cells := len(srvs)
	// Demand per interval s: cell 1 300, cell 2 200, cell 3 40; 10,800
	// per window against a limit of 3000.
	demand := []int64{300, 200, 40}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 3000, Period: period}
	p := l.Period.Microseconds()
	key := "global-" + delay.String()
	clk := &fakeClock{}
	clk.us.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()) // a window start
	ctx := context.Background()
	exch := &lagged{clk: clk, delay: delay}
	cs := make([]*Cell, cells)
	insts := make([]*Leaser, cells)
	for i := range cells {
		o := redis.DefaultOptions()
		o.URL, o.Now = srvs[i].URL(), clk.Now
		st := redisStore(t, o)
		cs[i] = NewCell(CellOptions{ID: int64(i + 1), Store: st, Key: key, Limit: l, Headroom: headroom, Exchange: exch, Now: clk.Now}, cells)
		ls, err := New(Options{Store: st, Subscriber: int64(i + 1), Interval: step, Timeout: time.Minute, Now: clk.Now, Ticker: noTicks})
		if err != nil {
			t.Fatal(err)
		}
		insts[i] = ls
		t.Cleanup(func() { _ = ls.Close(ctx) })
	}
	admitted := make([]map[int64]int64, cells)
	for i := range admitted {
		admitted[i] = map[int64]int64{}
	}
	var failures, badWindow atomic.Int64
	ticksPerStep := int(step / tick)
	for k := range windows * int(period/tick) {
		if k > 0 {
			clk.advance(tick)
		}
		now := clk.us.Load()
		ws := now - now%p
		for i, c := range cs {
			if k%ticksPerStep == (3*i)%ticksPerStep { // staggered phases
				if err := c.Step(ctx); err != nil {
					t.Fatalf("cell %d: %v", i+1, err)
				}
			}
		}
		if k%(ticksPerStep/2) == 0 { // the instances' renewal loop
			for _, ls := range insts {
				ls.renewDue()
				quiet(t, ls)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range cells {
			n := demand[i] * int64(tick) / int64(step)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var got int64
					for j := int64(w); j < n; j += workers {
						cs[i].Asked(1)
						d, failed, _, err := insts[i].Take(ctx, []algo.Hit{{Key: key, Limit: cs[i].Limit(), Cost: 1}})
						if len(failed) > 0 {
							failures.Add(1)
							t.Errorf("cell %d: hit failed: %v", i+1, err)
							continue
						}
						if !d[0].Allowed {
							continue
						}
						if end := now + d[0].ResetAfter.Microseconds(); end != ws+p {
							badWindow.Add(1)
						}
						got++
					}
					mu.Lock()
					admitted[i][ws] += got
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		for _, ls := range insts {
			quiet(t, ls)
		}
		if failures.Load() > 0 {
			t.FailNow()
		}
	}

	budget := int64(float64(l.Rate) * (1 - headroom))
	bound := cellBound(budget, delay, step, demand)
	t.Logf("report delay %v, Step interval %v: bound %d (the limit %d, the budget %d)", delay, step, bound, l.Rate, budget)
	if delay <= 2*step && bound > l.Rate {
		t.Fatalf("the bound %d for a delay of %v exceeds the limit %d: the headroom does not cover it", bound, delay, l.Rate)
	}
	start := clk.us.Load() - clk.us.Load()%p - int64(windows-1)*p
	for w := range windows {
		ws := start + int64(w)*p
		var sum int64
		per := make([]int64, cells)
		for i := range cells {
			per[i] = admitted[i][ws]
			sum += per[i]
		}
		over := sum - budget
		t.Logf("window %d: admitted %d %v, over-admission against the budget %+d (%.1f %% of the limit; headroom %.0f %%)",
			w, sum, per, over, 100*float64(over)/float64(l.Rate), 100*headroom)
		if w == 0 {
			continue // no reports yet
		}
		if sum > bound {
			t.Errorf("window %d: admitted %d > the bound %d for a report delay of %v", w, sum, bound, delay)
		}
		if sum < budget/2 {
			t.Errorf("window %d: admitted %d, less than half the budget %d", w, sum, budget)
		}
	}
	if n := badWindow.Load(); n > 0 {
		t.Errorf("%d decisions carried another window than the fake clock's", n)
	}
}

// newTestCell is cell 1 of cells on a memory store, on a fake clock at a
// window start, sharing 3000 per 20 minutes with a 15 % headroom.
func newTestCell(t *testing.T, cells int) (*Cell, *lagged) {
	t.Helper()
	clk := &fakeClock{}
	clk.us.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
	st, err := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	exch := &lagged{clk: clk}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 3000, Period: 20 * time.Minute}
	return NewCell(CellOptions{ID: 1, Store: st, Key: "k", Limit: l, Headroom: 0.15, Exchange: exch, Now: clk.Now}, cells), exch
}

// own returns cell 1's last report.
func (x *lagged) own() CellReport {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := len(x.sent) - 1; i >= 0; i-- {
		if x.sent[i].r.Cell == 1 {
			return x.sent[i].r
		}
	}
	return CellReport{}
}

// A cell that has heard from no other cell yet counts each of them as
// claiming the even split: its allowance stays within the budget less
// those splits, whatever its demand.
func TestCellClaimsUnheardCells(t *testing.T) {
	c, _ := newTestCell(t, 3)
	c.Asked(2000)
	if err := c.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	budget := int64(2550)
	if got, most := c.Limit().Rate, budget-2*(budget/3); got > most {
		t.Errorf("allowance %d with two cells not heard of, want at most %d (the budget %d less two even splits)", got, most, budget)
	}
}

// A cell whose allowance shrinks reports the one before it as well:
// lease operations in flight may still carry it, so the other cells must
// count it.
func TestCellReportsPreviousAllowance(t *testing.T) {
	c, exch := newTestCell(t, 2)
	ctx := context.Background()
	ws := c.opt.Now().UnixMicro()
	exch.Publish(CellReport{Cell: 2, Window: ws})
	c.Asked(1000)
	if err := c.Step(ctx); err != nil {
		t.Fatal(err)
	}
	first := c.Limit().Rate
	if first != 1000 {
		t.Fatalf("allowance %d, want the demand 1000 (the other cell claims nothing)", first)
	}
	exch.Publish(CellReport{Cell: 2, Window: ws, Allowance: 2000})
	c.Asked(1000)
	if err := c.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Limit().Rate; got >= first {
		t.Fatalf("allowance %d after the other cell claimed 2000, want less than %d", got, first)
	}
	if r := exch.own(); r.Allowance < first {
		t.Errorf("reported Allowance %d, want at least the previous allowance %d", r.Allowance, first)
	}
}
