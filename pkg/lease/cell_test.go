package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// delayed is an Exchange between cells whose reports arrive after delay.
type delayed struct {
	delay time.Duration
	mu    sync.Mutex
	peers []*delayed
	got   map[int64]CellReport
}

func (d *delayed) Publish(r CellReport) {
	for _, p := range d.peers {
		if p == d {
			continue
		}
		time.AfterFunc(d.delay, func() {
			p.mu.Lock()
			if old, ok := p.got[r.Cell]; !ok || old.Window < r.Window || (old.Window == r.Window) {
				p.got[r.Cell] = r
			}
			p.mu.Unlock()
		})
	}
}

func (d *delayed) Latest() []CellReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]CellReport, 0, len(d.got))
	for _, r := range d.got {
		out = append(out, r)
	}
	return out
}

// Three cells, each a redis-server with its own instance leasing from it,
// share 3000 per second with a headroom of 15 % (10–15 % is the usual
// headroom of cross-region enforcement); their reports reach each
// other 50 ms late. Demand is above the limit and uneven (one cell asks
// far more than the others). Each window's units admitted across the
// cells stay within the limit: the over-admission against the target
// (the limit less the headroom) stays within the headroom.
func TestCellsWithinHeadroom(t *testing.T) {
	redistest.Require(t)
	const (
		cells    = 3
		headroom = 0.15
		delay    = 50 * time.Millisecond
	)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 3000, Period: time.Second}
	p := l.Period.Microseconds()
	ctx := context.Background()
	exch := make([]*delayed, cells)
	for i := range exch {
		exch[i] = &delayed{delay: delay, got: map[int64]CellReport{}}
	}
	for i := range exch {
		exch[i].peers = exch
	}
	cs := make([]*Cell, cells)
	insts := make([]*Leaser, cells)
	for i := range cells {
		srv := redistest.Standalone(t)
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		st := redisStore(t, o)
		cs[i] = NewCell(CellOptions{ID: int64(i + 1), Store: st, Key: "global", Limit: l, Headroom: headroom, Exchange: exch[i]}, cells)
		ls, err := New(Options{Store: st, Subscriber: int64(i + 1), Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		insts[i] = ls
		t.Cleanup(func() { _ = ls.Close(ctx) })
	}
	// A window that began before a server did grants nothing (the
	// servers' starts are known to the second).
	time.Sleep(1200 * time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() { // the cell's interval
			defer wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if err := c.Step(ctx); err != nil {
					t.Errorf("cell %d: %v", i+1, err)
					return
				}
			}
		}()
	}
	ty := &tally{p: p, n: map[int64]int64{}}
	// Uneven demand: cell 1 unpaced, cell 2 about 4000/s, cell 3 about
	// 800/s.
	paces := []time.Duration{0, 2 * time.Millisecond, 5 * time.Millisecond}
	for i := range cells {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if paces[i] > 0 {
						time.Sleep(paces[i])
					}
					cs[i].Asked(1)
					tb := time.Now()
					d, failed, _, _ := insts[i].Take(ctx, []algo.Hit{{Key: "global", Limit: cs[i].Limit(), Cost: 1}})
					ta := time.Now()
					if len(failed) == 0 && d[0].Allowed {
						ty.add(tb, ta, d[0])
					}
				}
			}()
		}
	}
	now := time.Now().UnixMicro()
	from := now - now%p + p
	time.Sleep(time.Duration(5*p+p/10) * time.Microsecond)
	now = time.Now().UnixMicro()
	to := now - now%p
	close(stop)
	wg.Wait()

	got := ty.windows()
	target := int64(float64(l.Rate) * (1 - headroom))
	worst := int64(-1 << 62)
	for ws := from; ws < to; ws += p {
		over := got[ws] - target
		worst = max(worst, over)
		t.Logf("window %d: admitted %d across the cells, target %d, over-admission %+d (%.1f %% of the limit; headroom %.0f %%)",
			ws, got[ws], target, over, 100*float64(over)/float64(l.Rate), 100*headroom)
		// The headroom bound holds while the cells' 50 ms steps and
		// reports run on time; on a loaded host they run late and the
		// bound moves with the lag, so it is asserted in make test-long
		// (RATELIMITD_LONG=1) on a quiet host, and measured here.
		if got[ws] > l.Rate && testproc.Long() {
			t.Errorf("window %d: admitted %d > limit %d: over-admission %d beyond the headroom %d", ws, got[ws], l.Rate, over, l.Rate-target)
		}
		if got[ws] < target/2 {
			t.Errorf("window %d: admitted %d, less than half the target %d", ws, got[ws], target)
		}
	}
	t.Logf("largest over-admission against the target: %+d units (%.1f %% of the limit), headroom %d units, report delay %v",
		worst, 100*float64(worst)/float64(l.Rate), l.Rate-target, delay)
	if n := ty.bad.Load(); n > 0 {
		t.Errorf("%d decisions carried a window their call did not span", n)
	}
}
