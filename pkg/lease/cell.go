package lease

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/fairshare"
)

// CellReport is what a cell tells the other cells every interval about one
// limit: how much of the window it used, the most it may use before its
// next report, and how much it was asked for.
type CellReport struct {
	// Cell identifies the reporting cell (>= 1).
	Cell int64
	// Window is the window start (µs) Used belongs to.
	Window int64
	// Used is the units the cell's store granted in Window.
	Used int64
	// Allowance is the most the cell's store grants in Window, Used
	// included, until the cell's next report: the larger of the
	// allowance the cell just set and the one before it (the even split
	// for its first Step in a window), which lease operations in flight
	// may still carry.
	Allowance int64
	// Demand is the units the cell was asked for over its last interval.
	Demand int64
}

// Exchange carries the reports between cells (regions): Publish sends the
// cell's own, Latest returns the last report received from every other
// cell. Its latency is the cells' report lag; ratelimitd ships no
// cross-region transport, tests inject one with a delay.
type Exchange interface {
	// Publish sends r to the other cells.
	Publish(r CellReport)
	// Latest returns the last report received from each other cell.
	Latest() []CellReport
}

// CellOptions configure a Cell.
type CellOptions struct {
	// ID identifies the cell among the cells (>= 1).
	ID int64
	// Store is the cell's own store, which its instances lease from.
	Store Store
	// Key is the shared limit's key in every cell's store.
	Key string
	// Limit is the limit the cells share: Limit.Rate per window across
	// all cells (fixed_window).
	Limit algo.Limit
	// Headroom is the share of the limit the cells keep back, in [0, 1):
	// it absorbs what the cells admit beyond their claims when reports
	// lag by more than two intervals (see Cell).
	Headroom float64
	// Exchange carries the reports.
	Exchange Exchange
	// Now is the clock (nil means time.Now).
	Now func() time.Time
}

// probeSubscriber is added to a cell's ID for its reads of its store: the
// instances' subscriber ids are below it.
const probeSubscriber = 1 << 52

// Cell divides a global limit among cells, each enforcing its allowance
// locally with leases on its own store. Every interval (Step, called by
// its owner) it reads what its store granted in the window, sets its
// allowance to that plus its max-min fair share (pkg/fairshare, cells as
// subscribers) of the budget (the limit less the headroom) less what it
// used and less every other cell's claim, and publishes its report. A
// cell's claim is its reported Allowance (or use, if larger) plus two
// intervals of its demand; before its first report of the window, the
// even split plus two intervals of its last reported demand.
//
// A share never exceeds the cell's smoothed demand of one interval, and a
// claim covers two intervals of it, so under steady demand reports up to
// two intervals late never let the cells together exceed the budget
// (docs/leases.md derives the bound for later ones). The headroom covers
// late reports, demand surges and clock skew.
type Cell struct {
	opt   CellOptions
	alloc *fairshare.Allocator
	mu    sync.Mutex
	n     int64 // cells sharing the limit: NewCell's count, or more heard of
	allow int64 // the cell's allowance for the window ws
	prev  int64 // the allowance before allow in the window ws (the even split first)
	ws    int64
	asked int64 // units asked since the last Step
}

// NewCell returns a Cell among cells cells. Until its first Step in a
// window, a cell's allowance is an even split of the limit less the
// headroom among the cells.
func NewCell(opt CellOptions, cells int) *Cell {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Cell{opt: opt, alloc: fairshare.New(fairshare.Options{Floor: 1}), n: int64(max(cells, 1)), ws: -1}
}

// budget is the limit less the headroom.
func (c *Cell) budget() int64 {
	return int64(float64(c.opt.Limit.Rate) * (1 - c.opt.Headroom))
}

// split is a cell's allowance in a window it has not divided yet (c.mu
// held).
func (c *Cell) split() int64 { return c.budget() / c.n }

// Limit is the limit the cell's instances enforce now: the shared
// limit's with the cell's allowance as its rate.
func (c *Cell) Limit() algo.Limit {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.opt.Limit
	t := c.opt.Now().UnixMicro()
	p := l.Period.Microseconds()
	if t-t%p != c.ws {
		l.Rate = c.split() // a window no Step has divided yet
		return l
	}
	l.Rate = max(c.allow, 0)
	return l
}

// Asked records n units asked of the cell (its demand).
func (c *Cell) Asked(n int64) {
	c.mu.Lock()
	c.asked += n
	c.mu.Unlock()
}

// Step does one interval: reads the cell's use of the window from its
// store (a lease operation asking nothing), recomputes the allowance and
// publishes the report.
func (c *Cell) Step(ctx context.Context) error {
	l := c.opt.Limit
	g, err := c.opt.Store.Lease(ctx, algo.LeaseRequest{Key: c.opt.Key, Limit: l, Subscriber: probeSubscriber + c.opt.ID, Stale: l.Period.Microseconds()})
	if err != nil {
		return err
	}
	p := l.Period.Microseconds()
	ws := g.Now - g.Now%p
	used := l.Rate - g.Remaining // the probe's limit is the whole one
	reports := c.opt.Exchange.Latest()
	c.mu.Lock()
	demand := c.asked
	c.asked = 0
	others := int64(0)
	for _, r := range reports {
		if r.Cell != c.opt.ID {
			others++
		}
	}
	c.n = max(c.n, others+1)
	split := c.split()
	if ws != c.ws {
		// A new window starts from the even split (Limit), which the
		// instances enforce until this Step.
		c.ws, c.allow = ws, split
	}
	total := used + (c.n-1-others)*split // cells not heard of: the even split
	demands := map[string]int64{cellID(c.opt.ID): demand}
	for _, r := range reports {
		if r.Cell == c.opt.ID {
			continue
		}
		// Until its next report arrives the cell may claim more:
		// about an interval of its demand per Step. Two intervals of
		// it count as claimed (see Cell).
		claim := split + 2*r.Demand
		if r.Window == ws {
			claim = max(r.Used, r.Allowance) + 2*r.Demand
		}
		total += claim
		demands[cellID(r.Cell)] = r.Demand
	}
	rem := max(c.budget()-total, 0)
	share := c.alloc.Allocate(time.UnixMicro(g.Now), rem, demands)[cellID(c.opt.ID)]
	c.prev, c.allow = c.allow, used+share
	r := CellReport{Cell: c.opt.ID, Window: ws, Used: used, Allowance: max(c.allow, c.prev), Demand: demand}
	c.mu.Unlock()
	c.opt.Exchange.Publish(r)
	return nil
}

func cellID(id int64) string { return strconv.FormatInt(id, 10) }
