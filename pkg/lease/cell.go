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
// limit: how much of the window it used and how much it was asked for.
type CellReport struct {
	// Cell identifies the reporting cell (>= 1).
	Cell int64
	// Window is the window start (µs) Used belongs to.
	Window int64
	// Used is the units the cell's store granted in Window.
	Used int64
	// Allowance is the units the cell may use in Window, Used included,
	// as it divided them at the report: it will not use more before its
	// next report.
	Allowance int64
	// Demand is the units the cell was asked for over its last interval.
	Demand int64
}

// Exchange carries the reports between cells (regions): Publish sends the
// cell's own, Latest returns the last report received from every other
// cell. Its latency is the cells' view lag; ratelimitd ships no
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
	// it absorbs what the cells admit before their reports arrive.
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
// locally with leases on its own store: every interval (Step) it reads
// what its store granted in the window, publishes it with its demand,
// and sets its allowance to what it used plus its max-min fair share
// (pkg/fairshare, cells as subscribers) of what is free of the limit
// less the headroom: less what it used, and less every other cell's
// allowance (or use, if larger) by the latest reports. A cell thus only
// ever takes a share of room no other cell had claimed when it last
// reported; the reports' lag, during which two cells may claim the same
// room, is what the headroom covers.
type Cell struct {
	opt   CellOptions
	alloc *fairshare.Allocator
	mu    sync.Mutex
	allow int64 // the cell's allowance for the window ws
	ws    int64
	cells int64 // cells heard of, itself included
	asked int64 // units asked since the last Step
}

// NewCell returns a Cell. Until its first Step in a window, a cell's
// allowance is an even split of the limit less the headroom among the
// cells it has heard of (cells, before any report).
func NewCell(opt CellOptions, cells int) *Cell {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Cell{opt: opt, alloc: fairshare.New(fairshare.Options{Floor: 1}), cells: int64(max(cells, 1)), ws: -1}
}

// budget is the limit less the headroom.
func (c *Cell) budget() int64 {
	return int64(float64(c.opt.Limit.Rate) * (1 - c.opt.Headroom))
}

// Limit is the limit the cell's instances enforce now: the shared
// limit's with the cell's allowance as its rate.
func (c *Cell) Limit() algo.Limit {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.opt.Limit
	t := c.opt.Now().UnixMicro()
	p := l.Period.Microseconds()
	if t-t%p != c.ws {
		l.Rate = c.budget() / c.cells // a window no Step has divided yet
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
// store (a lease operation asking nothing), publishes it and recomputes
// the allowance.
func (c *Cell) Step(ctx context.Context) error {
	l := c.opt.Limit
	g, err := c.opt.Store.Lease(ctx, algo.LeaseRequest{Key: c.opt.Key, Limit: l, Subscriber: probeSubscriber + c.opt.ID, Stale: l.Period.Microseconds()})
	if err != nil {
		return err
	}
	p := l.Period.Microseconds()
	ws := g.Now - g.Now%p
	used := l.Rate - g.Remaining // the probe's limit is the whole one
	c.mu.Lock()
	demand := c.asked
	c.asked = 0
	c.mu.Unlock()
	total := used
	demands := map[string]int64{cellID(c.opt.ID): demand}
	for _, r := range c.opt.Exchange.Latest() {
		if r.Cell == c.opt.ID {
			continue
		}
		if r.Window == ws {
			total += max(r.Used, r.Allowance)
		} else {
			// No report of this window yet: the cell uses the even
			// split (Limit).
			total += c.budget() / c.cells
		}
		demands[cellID(r.Cell)] = r.Demand
	}
	rem := max(c.budget()-total, 0)
	share := c.alloc.Allocate(time.UnixMicro(g.Now), rem, demands)[cellID(c.opt.ID)]
	c.mu.Lock()
	c.allow, c.ws, c.cells = used+share, ws, int64(len(demands))
	c.mu.Unlock()
	c.opt.Exchange.Publish(CellReport{Cell: c.opt.ID, Window: ws, Used: used, Allowance: used + share, Demand: demand})
	return nil
}

func cellID(id int64) string { return strconv.FormatInt(id, 10) }
