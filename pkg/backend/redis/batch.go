package redis

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// DefaultPipelines is the number of flushes a Store keeps in flight at
// once per master (Options.Pipelines when 0). One: decisions that arrive
// while a flush is out accumulate into the next one, and a larger batch
// costs Redis less per decision.
const DefaultPipelines = 1

// maxBatch bounds the segments (requests, or Cluster slot groups of
// requests) of one flush, and so of one script invocation. Redis runs an
// invocation atomically and serves nothing else meanwhile, so a full
// batch must hold Redis well within the p99 target (BENCHMARKS.md).
const maxBatch = 64

// maxBatchHits bounds the hits of one flush (a batch of many-hit requests
// costs Redis more per segment). A request with more hits than this still
// goes out, alone.
const maxBatchHits = 4 * maxBatch

// maxWindowHits bounds the window-key hits (segment.window) of one flush,
// which go out as one window.lua invocation next to the others: a lean
// decision costs Redis a fraction of a take.lua segment, so more of them
// fit in the same hold of the server. A request with more such hits still
// goes out, alone.
const maxWindowHits = 128

// batcher batches the script calls of concurrent requests: each call (one
// segment) is queued, and up to `pipelines` resident flush loops each send
// what is queued (at most maxBatch segments, maxBatchHits hits) as one
// script invocation (Cluster: one per hash slot, in one pipeline). Under
// load a request costs a share of one EVALSHA; under light load a call goes
// out alone at once. On standalone and Sentinel each loop pins a pooled
// connection (slotConn), which keeps go-redis' health check off the
// request path.
//
// Every call has a budget (see budget). Time spent queued counts against
// the budget only, never against the Redis Timeout, so CPU pressure alone
// cannot fail a live Redis; each Timeout a socket stays stalled is reported
// to the circuit breaker (see liveness). A call whose budget runs out gets
// ErrCallTimeout while Redis looks stalled, ErrDeadline otherwise, and
// ErrStalled once the stall is established; while the circuit is open every
// pending call completes at once. One sweeper goroutine enforces the
// budgets (see sweeper); a Store has one batcher per master (see master).
type batcher struct {
	client    goredis.UniversalClient
	pipelines int
	cluster   bool          // group by hash slot: one invocation per slot
	timeout   time.Duration // Options.Timeout: an unanswered invocation this old is overdue
	// establish is how long a stall must have lasted before calls get
	// ErrStalled (establishAfter); 0: never.
	establish time.Duration
	maxWait   time.Duration // budget of a call whose context has no deadline
	margin    time.Duration // kept before the caller's deadline
	// waitReplicas is Options.WaitReplicas: replicas that must acknowledge
	// an invocation's writes (WAIT) before its decisions are used.
	waitReplicas int
	tick         time.Duration    // the sweeper's period
	now          func() time.Time // the Store's clock (time.Now by default)
	epoch        time.Time        // origin of the ns clocks below
	// overdue, when set, is told (outside mu) that Redis has been stalled
	// since `since` for one more Timeout. open, when set, reports that the
	// circuit is open (called under mu; it must not call back into the
	// batcher).
	overdue func(since time.Time)
	open    func() error
	// live decides whether Redis is stalled from the sockets themselves
	// (see liveness); nil (batchers built without a Store, in tests):
	// never stalled. liveAddr limits it to the sockets of one Cluster
	// master ("": every socket; see liveness.stalledAt).
	live     *liveness
	liveAddr string
	// fn is the master's window1Func state (nil: EVALSHA only); fnName
	// names the master in its log line (master.name).
	fn     *fnState
	fnName string

	// slots are the flush loops' own state (each touched by its loop
	// only, but for its timer's callback).
	slots []*slotConn

	mu    sync.Mutex
	queue []*scriptCall
	spare []*scriptCall // the previous queue's backing array, for reuse
	// stallFrom is when the stall live reports began (ns since epoch; 0:
	// none); strikes is how many Timeouts of it were reported as overdue.
	stallFrom int64
	strikes   int64
	flights   [][]*scriptCall // per flush loop slot: the batch in flight
	busy      []bool          // per flush loop slot: it has work (woken, flushing)
	// alarms, per flush loop slot: when its flush's timer wakes the
	// sweeper (ns since epoch; 0: not armed yet). See covered.
	alarms    []atomic.Int64
	inFlight  int             // busy flush loops
	sweeping  bool            // the sweeper ticks (woken, not parked)
	started   bool            // the flush loops and the sweeper run
	wake      []chan struct{} // per flush loop slot: one token when it turns busy
	sweepWake chan struct{}   // one token when sweeping turns true
	quit      chan struct{}   // closed by close
	sweeps    atomic.Int64    // sweeper ticks so far (tests)
	wg        sync.WaitGroup
	closed    bool
}

// pinIdle is how long a flush loop's pinned connection may sit unused
// before the loop gives it back to the pool and pins another, which the
// pool health-checks: an idle connection may have been closed meanwhile (a
// restart, a failover, the server's timeout).
const pinIdle = 50 * time.Millisecond

// slotConn is a flush loop's connection and reusable per-flush state.
type slotConn struct {
	// conn is the pinned connection (nil: none pinned now, or a Cluster
	// client, whose flushes go through the client).
	conn *goredis.Conn
	// used is when conn last carried a flush (ns since batcher.epoch).
	used int64
	// ctx is the flushes' context: no values, never canceled, and
	// Deadline the latest budget of the flush's calls, which go-redis
	// applies to the socket; reused, so a flush allocates no context and
	// no runtime timer.
	ctx slotCtx
	// timer wakes the sweeper when a flush is still unanswered at the
	// earliest budget of its calls or after a Timeout; armed for each
	// flush, stopped when it returns.
	timer *time.Timer
	// live is exec's reusable buffer.
	live []*scriptCall
	// inv and invs are groupScript's invocation when a flush sends all
	// its calls in one (the usual case), reused so that it allocates
	// neither; cleared when the flush returns.
	inv  invocation
	invs [1]*invocation
}

// slotCtx is a context.Context whose Deadline is set per flush (see
// slotConn.ctx). Its Done is nil: nothing waits on it but the socket
// deadline go-redis derives from Deadline.
type slotCtx struct {
	context.Context
	deadline time.Time
}

// Deadline is the flush's deadline.
func (c *slotCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// newBatcher batches script calls on c with at most pipelines flushes in
// flight (< 1: DefaultPipelines). timeout is Options.Timeout (> 0), maxWait
// the budget of calls without a context deadline and margin what is kept
// before a context's deadline (see budget).
func newBatcher(c goredis.UniversalClient, pipelines int, timeout, maxWait, margin time.Duration) *batcher {
	if pipelines < 1 {
		pipelines = DefaultPipelines
	}
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	_, cluster := c.(*goredis.ClusterClient)
	b := &batcher{
		client: c, pipelines: pipelines, cluster: cluster,
		timeout: max(time.Microsecond, timeout), maxWait: maxWait, margin: max(0, margin),
		tick: sweepTick(timeout), now: time.Now, epoch: time.Now(),
		flights: make([][]*scriptCall, pipelines), busy: make([]bool, pipelines), alarms: make([]atomic.Int64, pipelines),
		wake: make([]chan struct{}, pipelines), sweepWake: make(chan struct{}, 1),
		quit: make(chan struct{}), slots: make([]*slotConn, pipelines),
	}
	for i := range b.wake {
		b.wake[i] = make(chan struct{}, 1)
		sc := &slotConn{ctx: slotCtx{Context: context.Background()}}
		sc.timer = time.AfterFunc(time.Hour, b.kickSweeper)
		sc.timer.Stop()
		b.slots[i] = sc
	}
	return b
}

// pinnable reports whether flush loops pin connections: on a standalone
// or Sentinel client (a *goredis.Client) whose pool keeps at least one
// connection beyond the pinned ones (for the health probe, resets and
// the like).
func (b *batcher) pinnable() (*goredis.Client, bool) {
	c, ok := b.client.(*goredis.Client)
	if !ok {
		return nil, false
	}
	return c, c.Options().PoolSize > b.pipelines
}

// startLocked starts the flush loops and the sweeper. b.mu is held.
func (b *batcher) startLocked() {
	b.started = true
	b.wg.Add(len(b.wake) + 1)
	for slot := range b.wake {
		go b.flushLoop(slot)
	}
	go b.sweeper()
}

// budget is the deadline of a call queued at now (ns since b.epoch) with
// ctx: its context's deadline less min(margin, a quarter of the time
// left), so that the answer (a decision, or a failure mode) reaches the
// caller before it gives up; or now + maxWait without a deadline, and
// never later than that.
func (b *batcher) budget(ctx context.Context, now int64) int64 {
	dl := now + int64(b.maxWait)
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d)
		own := now + int64(left-min(b.margin, left/4))
		dl = min(dl, own)
	}
	return dl
}

// clock is the time in ns since b.epoch.
func (b *batcher) clock() int64 { return int64(b.now().Sub(b.epoch)) }

// useClock makes now the batcher's clock; call it before the first call.
func (b *batcher) useClock(now func() time.Time) { b.now, b.epoch = now, now() }

// wall is the real time of t (ns since b.epoch): go-redis sets socket
// deadlines on the real clock.
func (b *batcher) wall(t int64) time.Time {
	return time.Now().Add(time.Duration(t - b.clock()))
}

// errClosed is the error of a call made after Close.
var errClosed = errors.New("redis: store closed")

// do decides seg (EVALSHA, then EVAL when the server answers NOSCRIPT),
// batched with the segments of concurrent calls, writes its decisions into
// out (len(out) == len(seg.hits)) and returns the segment's now in µs; or
// the go-redis error of the invocation, or the segment's SegmentError, or
// ErrDeadline or ErrCallTimeout when the call's budget runs out first,
// ErrCircuitOpen when the circuit opens first, or ctx's error when ctx is
// canceled first (out is then left untouched).
func (b *batcher) do(ctx context.Context, seg segment, out []algo.Decision) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, b.ctxError(err)
	}
	c := newCall(ctx, &seg, out)
	c.queued = b.clock()
	c.deadline = b.budget(ctx, c.queued)
	c.window = seg.window
	if b.cluster && len(seg.hits) > 0 {
		c.slot = Slot(seg.hits[0].Key)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		c.refs.Store(1)
		c.release()
		return 0, errClosed
	}
	if !b.started {
		b.startLocked()
	}
	b.queue = append(b.queue, c)
	slot := -1
	if b.inFlight < b.pipelines {
		slot = slices.Index(b.busy, false)
		b.busy[slot] = true
		b.inFlight++
	}
	// Queued behind busy flush loops: only the sweeper bounds its wait,
	// unless a flush's timer already wakes it in time (covered).
	sweep := slot < 0 && !b.sweeping && !b.coveredLocked(c)
	if sweep {
		b.sweeping = true
	}
	b.mu.Unlock()
	if slot >= 0 {
		b.wake[slot] <- struct{}{}
	}
	if sweep {
		b.sweepWake <- struct{}{}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			c.release()
			return 0, b.ctxError(ctx.Err())
		}
		<-c.done // claimed: the result is being written now
	}
	now, err := c.now, c.err
	c.release()
	return now, err
}

// coveredLocked reports whether c, just queued behind busy flush loops,
// needs no sweeper of its own: the queue fits in one flush, so the next
// flush of any loop takes c, and a busy loop's flush timer, not fired yet,
// wakes the sweeper by c's budget should that flush not return first. So a
// request arriving while the previous one's flush delivers starts no
// sweeper ticks. b.mu is held.
func (b *batcher) coveredLocked(c *scriptCall) bool {
	if batchLen(b.queue) != len(b.queue) {
		return false
	}
	now := b.clock()
	for s, busy := range b.busy {
		if a := b.alarms[s].Load(); busy && now < a && a <= c.deadline {
			return true
		}
	}
	return false
}

// close stops accepting calls, lets the flush loops send what is queued
// (each flush within one Timeout), and waits for the loops and the
// sweeper to end; the loops give their pinned connections back.
func (b *batcher) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.wg.Wait()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.quit)
	b.wg.Wait()
}

// flushLoop is the resident loop of slot (its index in b.flights,
// b.busy, b.wake and b.slots): woken when it turns busy, it sends the
// queue as script invocations until it is empty, then parks again. It
// ends when the batcher is closed, after sending what was queued.
func (b *batcher) flushLoop(slot int) {
	defer b.wg.Done()
	defer b.slots[slot].unpin()
	var batch []*scriptCall
	for {
		select {
		case <-b.wake[slot]:
			batch = b.drain(slot, batch)
		case <-b.quit:
			// A call queued before close may have made the slot busy
			// and not sent its token yet: no call is queued after
			// closed is set, so busy (read under mu) is final.
			b.mu.Lock()
			busy := b.busy[slot]
			b.mu.Unlock()
			if busy {
				<-b.wake[slot]
				b.drain(slot, batch)
			}
			return
		}
	}
}

// drain sends the queue from slot until it is empty, then marks the slot
// idle; batch is a reusable buffer, returned for the next drain.
func (b *batcher) drain(slot int, batch []*scriptCall) []*scriptCall {
	for {
		b.mu.Lock()
		b.flights[slot] = nil // under mu: the sweeper reads it
		n := batchLen(b.queue)
		if n == 0 {
			b.inFlight--
			b.busy[slot] = false
			b.mu.Unlock()
			return batch
		}
		batch = append(batch[:0], b.queue[:n]...)
		b.flights[slot] = batch
		b.alarms[slot].Store(0) // exec arms it
		if n == len(b.queue) {
			// Swap in the spare backing array so that the next calls do not
			// reallocate the queue.
			clear(b.queue)
			b.queue, b.spare = b.spare[:0], b.queue[:0]
		} else {
			b.queue = append(b.queue[:0], b.queue[n:]...)
		}
		b.mu.Unlock()
		b.exec(slot, batch)
		b.mu.Lock()
		b.flights[slot] = nil
		b.mu.Unlock()
		for i, c := range batch {
			c.release()
			batch[i] = nil
		}
	}
}

// unpin gives the pinned connection back to the pool (go-redis drops
// it instead when it failed).
func (sc *slotConn) unpin() {
	if sc.conn != nil {
		_ = sc.conn.Close()
		sc.conn = nil
	}
}

// processor is what a flush sends on: the client, or a pinned connection.
type processor interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
	Pipeline() goredis.Pipeliner
}

// on is what slot's flushes send on at now (ns since b.epoch): its pinned
// connection, pinning one when there is none or the one pinned sat idle
// for pinIdle; the client itself when connections are not pinned.
func (b *batcher) on(slot int, now int64) processor {
	c, ok := b.pinnable()
	if !ok {
		return b.client
	}
	sc := b.slots[slot]
	if sc.conn != nil && now-sc.used >= int64(pinIdle) {
		sc.unpin()
	}
	if sc.conn == nil {
		sc.conn = c.Conn()
	}
	sc.used = now
	return sc.conn
}

// flushed gives slot's pinned connection back when a command of invs
// failed: go-redis may have marked the connection bad (a timeout, a reset
// or closed socket, a failed handshake), and the next flush pins a
// checked one. Errors are rare, so any error does.
func (b *batcher) flushed(slot int, invs []*invocation) {
	sc := b.slots[slot]
	if sc.conn == nil {
		return
	}
	for _, inv := range invs {
		failed := inv.cmd != nil && inv.cmd.Err() != nil || inv.wait != nil && inv.wait.Err() != nil
		if inv.native {
			for _, c := range inv.calls {
				for i := range c.native.incr {
					failed = failed || c.native.incr[i].Err() != nil || c.native.exp[i].Err() != nil
				}
			}
		}
		if failed {
			sc.unpin()
			return
		}
	}
}

// batchLen is how many calls from the head of queue one flush sends: at
// most maxBatch segments and maxBatchHits hits for take.lua, and
// maxWindowHits window-key hits for window.lua; at least one call.
func batchLen(queue []*scriptCall) int {
	n, segs, hits, wins := 0, 0, 0, 0
	for n < len(queue) {
		c := queue[n]
		h := c.hits()
		if c.window {
			if n > 0 && wins+h > maxWindowHits {
				break
			}
			wins += h
		} else {
			if segs == maxBatch || n > 0 && hits+h > maxBatchHits {
				break
			}
			segs++
			hits += h
		}
		n++
	}
	return n
}
