package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// DefaultPipelines is the number of flushes a Store keeps in flight at
// once per master (Options.Pipelines when 0). One: the decisions that
// arrive while a flush is out accumulate into the next one, and a larger
// batch costs Redis less per decision (one script call's fixed cost
// shared by more of them) without costing throughput, since a flush's
// round trip is short next to the service's own work per request (see
// docs/redis.md, "Throughput").
const DefaultPipelines = 1

// maxBatch bounds the segments (requests, or Cluster slot groups of
// requests) of one flush, and so of one script invocation. Redis runs an
// invocation atomically and serves nothing else meanwhile: measured 8–14
// µs of Redis time per one-hit segment on the shared 2-core host, so a
// full batch holds Redis for about 0.5–0.9 ms (256 segments: about 4.8 ms,
// too long for a 2 ms p99; see docs/redis.md, "Throughput").
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

// batcher batches the script calls of concurrent requests: a call (one
// segment) is queued, and up to `pipelines` flush loops each take what is
// queued (at most maxBatch segments, maxBatchHits hits) and send it as ONE
// script invocation deciding every segment in order (Cluster: one
// invocation per hash slot, all in one go-redis pipeline, which go-redis
// splits per node). Under load a request costs Redis a share of one
// EVALSHA and the service a share of one write and one read syscall, one
// command and one reply; no connection of its own. Under light load a call
// finds a free flush loop and goes out alone at once (no coalescing wait).
//
// The flush loops are resident: one goroutine per pipeline slot, started
// with the first call and parked on its slot's wake channel while the
// queue is empty, so a call spawns no goroutine. On a standalone or
// Sentinel client each slot pins one pooled connection (a goredis.Conn,
// see slotConn): a flush takes no connection from the pool, so go-redis'
// per-Get health check (a MSG_PEEK recvfrom) is not on the request path;
// a pinned connection that failed, or sat idle for pinIdle, goes back to
// the pool and the next flush pins a checked one. The caller waits on its
// call's reusable channel (calls are pooled), not on a new one.
//
// Every call has a budget (see budget): its caller's context deadline less
// a margin, or maxWait after it was queued when the context has none. Time
// a call spends queued inside ratelimitd counts against that budget only,
// never against the Redis Timeout: a burst or CPU pressure alone cannot
// turn a live Redis into a failure. The Timeout is evidence about Redis
// only: each Timeout that a socket to Redis stays stalled (a request
// written with no byte of reply since; see liveness) is reported to the
// circuit breaker (overdue). A call whose budget runs out completes with
// ErrCallTimeout while Redis looks stalled and with ErrDeadline otherwise;
// neither proves a failure, and the service sheds both (see ErrDeadline).
// Once the stall is established (it has lasted `establish`, the breaker's
// FailFor, and nothing was received from the master since it began), a
// pending call that has waited a Timeout itself completes at once with
// ErrStalled, and a budget that runs out gives ErrStalled too: the rules'
// failure modes answer within the caller's budget, as for a dead Redis. So does a call whose
// budget runs out after it waited `establish` itself with nothing
// received from the master since it was queued (a caller without a
// deadline on a stall that began as it was queued). A call gets its own
// Timeout first, so that a half-open probe sent to a Redis that answers
// again is decided, not failed on the old evidence.
// While the circuit breaker is open (open reports its error), every
// pending call completes at once with it (ErrCircuitOpen, or
// ErrStalledOpen when only stalls opened it): no request waits on a dead
// Redis.
//
// The budgets are enforced without a runtime timer per call: one sweeper
// goroutine per batcher completes every queued or in-flight call whose
// budget has passed, every sweepTick while it runs. It is parked (no
// ticker) unless a call may outlive what its flush bounds: it is woken
// when a call is queued behind busy flush loops whose timers do not
// cover its budget (coveredLocked), by a flush still
// unanswered at the earliest budget of its calls or after a Timeout
// (each slot's one reusable timer, armed per flush), and when the
// circuit opens (kickSweeper); it parks again at the first tick with
// nothing pending. A caller therefore waits at most sweepTick (plus
// scheduling) past its budget, and never past its context's end by more
// than scheduling. Calls whose budget passed while queued are not sent.
// An invocation is bounded by the latest budget of its calls (the slot's
// reusable context, see slotCtx). An error of the invocation (refused,
// OOM, READONLY, NOSCRIPT after the retry...) reaches every call of it;
// an error the script reports for one segment reaches that call only
// (SegmentError).
//
// A Store has one batcher per master (Cluster: one per master, with its
// own circuit and liveAddr; see master), so that the flush loops, stalls
// and open circuit of a frozen or dead master hold no other master's
// calls.
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
	tick         time.Duration // the sweeper's period
	epoch        time.Time     // origin of the ns clocks below (monotonic)
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
	// noNX, when set, is true once a server refused PEXPIRE's NX (Redis
	// 6): native calls then send PEXPIRE without it (see nativeCall).
	noNX *atomic.Bool

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
// pool checks (go-redis' health check on Get): a connection that idle may
// have been closed meanwhile (a Redis restart, a failover, the server's
// timeout), which a request on it would find by failing. Under steady
// traffic a loop's flushes come closer together than that, and skip the
// check.
const pinIdle = 50 * time.Millisecond

// slotConn is a flush loop's connection and reusable per-flush state.
type slotConn struct {
	// conn is the pinned connection (nil: none pinned now, or a Cluster
	// client, whose flushes go through the client as before).
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

// sweepTick is the sweeper's period for a Timeout: a tenth of it, between
// 100 µs and 1 ms. It is the slack of the Timeout (see batcher).
func sweepTick(timeout time.Duration) time.Duration {
	return min(time.Millisecond, max(100*time.Microsecond, timeout/10))
}

// ErrCallTimeout is the error of a call whose budget ran out while Redis
// looked stalled: a request written to one of its sockets at least
// Options.Timeout ago had no byte of reply since (its cause is
// CauseTimeout, an outage; errors.Is context.DeadlineExceeded), before
// the stall is established (see ErrStalled).
var ErrCallTimeout error = newError(CauseTimeout, true,
	fmt.Errorf("redis: no reply within the timeout: %w", context.DeadlineExceeded))

// ErrStalled is the error of a call on a master whose stall is
// established: its sockets have had a request unanswered, with nothing
// received, for establishAfter, and the call itself has waited a
// Timeout (or its budget ran out) with still nothing received. Its cause
// is CauseStalled, an outage: the rules' failure modes answer, as for a
// dead Redis.
var ErrStalled error = newError(CauseStalled, true,
	errors.New("redis: stalled: no reply from redis, stall established"))

// ErrDeadline is the error of a call whose budget ran out while Redis was
// answering: it was still queued, or in flight for less than
// Options.Timeout, or Redis answered other invocations since it was sent.
// The backend did not fail; ratelimitd could not decide within the
// caller's deadline (CPU starvation, a burst beyond what fits in the
// deadline). Its cause is CauseDeadline: not an outage, it never opens the
// circuit; errors.Is context.DeadlineExceeded. Whether the hit was
// counted is unknown to the caller (it was, if its invocation reached
// Redis).
var ErrDeadline error = newError(CauseDeadline, false,
	fmt.Errorf("redis: not decided within the caller's deadline: %w", context.DeadlineExceeded))

// Call states: a flush completes a pending call only after claiming it,
// and a caller leaving at its deadline abandons it, so the flush never
// writes into a caller's decisions after the caller returned.
const (
	callPending int32 = iota
	callClaimed
	callAbandoned
)

// scriptCall is one queued segment and, once done has delivered its
// token, its result. Calls are pooled (callPool): the caller and the flush
// loop that takes it from the queue each hold a reference (refs), and the
// last one to let go puts it back.
type scriptCall struct {
	ctx      context.Context
	queued   int64           // when it was queued, ns since batcher.epoch
	deadline int64           // the call's budget, ns since batcher.epoch
	args     segArgs         // the segment's script arguments
	native   *nativeCall     // the segment's commands when it is native (args unused)
	slot     uint16          // Cluster: the hash slot of every key of seg
	window   bool            // seg.window: decided by window.lua
	out      []algo.Decision // the segment's decisions, written on success
	now      int64           // the segment's now in µs, on success
	err      error
	state    atomic.Int32
	refs     atomic.Int32
	// done receives one token once the call is claimed and completed
	// (capacity 1, reused with the call).
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &scriptCall{done: make(chan struct{}, 1)} }}

// newCall is a pending call deciding seg into out, with two references
// (see scriptCall).
func newCall(ctx context.Context, seg *segment, out []algo.Decision) *scriptCall {
	c := callPool.Get().(*scriptCall)
	c.ctx, c.out = ctx, out
	c.state.Store(callPending)
	c.refs.Store(2)
	if seg.native {
		c.native = newNativeCall(seg.hits, seg.nowUS)
	} else {
		c.args.init(seg)
	}
	return c
}

// release drops one reference to c; the last one resets it and puts it
// back in callPool.
func (c *scriptCall) release() {
	if c.refs.Add(-1) != 0 {
		return
	}
	*c = scriptCall{done: c.done}
	callPool.Put(c)
}

// hits is the number of hits the call decides.
func (c *scriptCall) hits() int {
	if c.native != nil {
		return len(c.native.keys)
	}
	return c.args.hits()
}

func (c *scriptCall) claim() bool { return c.state.CompareAndSwap(callPending, callClaimed) }

// finish completes a claimed call.
func (c *scriptCall) finish(now int64, err error) {
	c.now, c.err = now, err
	c.done <- struct{}{}
}

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
		tick: sweepTick(timeout), epoch: time.Now(),
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

// kickSweeper wakes the sweeper unless it ticks already.
func (b *batcher) kickSweeper() {
	b.mu.Lock()
	kick := !b.sweeping && !b.closed
	b.sweeping = b.sweeping || kick
	b.mu.Unlock()
	if kick {
		b.sweepWake <- struct{}{}
	}
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

// clock is the monotonic time in ns since b.epoch.
func (b *batcher) clock() int64 { return int64(time.Since(b.epoch)) }

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
// flush of any loop takes c (and arms its timer for c's budget at the
// latest), and a busy loop's flush timer, not fired yet, wakes the
// sweeper by c's budget should that flush not return first (a timer that
// fired already may have found nothing pending, its sweeper parked
// since). A request that arrives while the flush of the previous one
// delivers (one flush loop, one request at a time) so starts no sweeper
// ticks. b.mu is held: a timer that fires from now on wakes the sweeper
// after c is queued.
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

// ctxError is the error of a call whose context ended before it was
// decided: budgetError when its deadline passed (the sweeper normally
// completes the call a margin earlier), the context's error otherwise
// (canceled: the caller is gone).
func (b *batcher) ctxError(err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	b.mu.Lock()
	stalled := b.stalledLocked()
	est := b.establishedLocked(b.clock())
	b.mu.Unlock()
	return budgetError(stalled, est)
}

// sweeper, once woken (sweepWake), every tick completes the pending
// calls (queued or in flight) whose budget has passed, reports overdue
// invocations, and completes every pending call with ErrCircuitOpen while
// the circuit is open; at the first tick without a pending call it parks
// again, until the next wake. It ends once the batcher is closed (quit)
// while parked: close waits for the flush loops, which complete every
// call, so a sweeper ticking then parks after them.
func (b *batcher) sweeper() {
	defer b.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-b.sweepWake:
		case <-b.quit:
			return
		}
		for {
			t.Reset(b.tick)
			<-t.C
			if !b.sweep() {
				break
			}
		}
	}
}

// sweep is one tick of the sweeper; it reports whether calls are still
// pending, and when none is, it clears b.sweeping (the sweeper parks).
func (b *batcher) sweep() bool {
	b.sweeps.Add(1)
	now := b.clock()
	b.mu.Lock()
	var open error
	if b.open != nil {
		open = b.open()
	}
	stalled := b.stalledLocked()
	est := b.establishedLocked(now)
	pending := b.sweepLocked(b.queue, now, open, stalled, est)
	for _, f := range b.flights {
		pending += b.sweepLocked(f, now, open, stalled, est)
	}
	var overdue int64 = -1
	if stalled && b.stallFrom != 0 {
		if k := (now - b.stallFrom) / int64(b.timeout); k > b.strikes {
			b.strikes = k
			overdue = b.stallFrom
		}
	}
	if pending == 0 {
		b.sweeping = false
	}
	b.mu.Unlock()
	if b.overdue != nil && overdue >= 0 {
		b.overdue(b.epoch.Add(time.Duration(overdue)))
	}
	return pending > 0
}

// stalledLocked reports whether Redis looks stalled: a socket (of
// liveAddr's master, when set) has had a request pending for Timeout with
// no byte received since (see liveness), and keeps stallFrom current. b.mu
// is held.
func (b *batcher) stalledLocked() bool {
	if b.live == nil {
		return false
	}
	since, ok := b.live.stalledAt(b.liveAddr, b.timeout)
	if !ok {
		b.stallFrom, b.strikes = 0, 0
		return false
	}
	if s := int64(since.Sub(b.epoch)); s != b.stallFrom {
		b.stallFrom, b.strikes = s, 0
	}
	return true
}

// establishedLocked reports whether the stall stalledLocked last saw is
// established at now (ns since b.epoch): it has lasted b.establish, and
// no byte has been received from the master (on any of its sockets)
// for b.establish, so a socket whose last write expects no reply cannot
// establish a stall while Redis answers the others. The silence is
// counted from the last byte received, not from when the stall began: a
// Redis that answered a later request and then froze (a SIGSTOP between
// two replies) leaves its earliest request unanswered with a reply
// received after it, and is stalled all the same. b.mu is held; call it
// after stalledLocked.
func (b *batcher) establishedLocked(now int64) bool {
	if b.establish <= 0 || b.stallFrom == 0 || now-b.stallFrom < int64(b.establish) {
		return false
	}
	return !b.live.heardSince(b.liveAddr, b.epoch.Add(time.Duration(now-int64(b.establish))))
}

// waitedOutLocked reports whether c, whose budget ran out at now while
// Redis looks stalled, has itself waited b.establish with nothing
// received from the master since it was queued. b.mu is held.
func (b *batcher) waitedOutLocked(c *scriptCall, now int64, stalled bool) bool {
	if !stalled || b.establish <= 0 || now-c.queued < int64(b.establish) {
		return false
	}
	return !b.live.heardSince(b.liveAddr, b.epoch.Add(time.Duration(c.queued)))
}

// budgetError is the error of a call whose budget ran out: ErrStalled
// once the stall is established, ErrCallTimeout while Redis looks stalled
// (stalledLocked), ErrDeadline otherwise.
func budgetError(stalled, established bool) error {
	switch {
	case stalled && established:
		return ErrStalled
	case stalled:
		return ErrCallTimeout
	}
	return ErrDeadline
}

// sweepLocked completes the calls of cs whose budget is at or before now
// (with budgetError), those that have waited a Timeout while the stall is
// established (with ErrStalled), or every pending call of cs when open
// (with the circuit's error, ErrCircuitOpen or ErrStalledOpen), and
// returns how many are still pending. b.mu is held.
func (b *batcher) sweepLocked(cs []*scriptCall, now int64, open error, stalled, established bool) int {
	pending := 0
	for _, c := range cs {
		if c.state.Load() != callPending {
			continue
		}
		var err error
		switch {
		case open != nil:
			err = open
		case c.deadline <= now:
			err = budgetError(stalled, established || b.waitedOutLocked(c, now, stalled))
		case established && now-c.queued >= int64(b.timeout):
			err = ErrStalled
		default:
			pending++
			continue
		}
		if c.claim() {
			c.finish(0, err)
		}
	}
	return pending
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

// invocation is the script invocation of one group of calls (all of them
// on standalone/Sentinel; one hash slot's on Cluster).
type invocation struct {
	calls []*scriptCall
	cmd   *goredis.Cmd // nil for native calls
	// native: the calls are native (their commands are in each
	// call's nativeCall).
	native bool
	// wait is the WAIT that follows cmd when waitReplicas > 0.
	wait *goredis.IntCmd
}

// exec sends the live calls of batch (flush loop slot) as one script
// invocation per group (several in one pipeline on Cluster; a second
// round with EVAL for the invocations answered NOSCRIPT) and completes
// every call. The invocation's context ends at the latest budget of its
// calls.
func (b *batcher) exec(slot int, batch []*scriptCall) {
	sc := b.slots[slot]
	live := sc.live[:0]
	defer func() { clear(live); sc.live = live[:0]; sc.inv, sc.invs[0] = invocation{}, nil }()
	var deadline, earliest int64
	now := b.clock()
	stalled, est, checked := false, false, false
	for _, c := range batch {
		if c.state.Load() != callPending { // abandoned, or completed by the sweeper
			continue
		}
		if c.deadline <= now { // never sent: not decided in time
			if !checked {
				b.mu.Lock()
				stalled, checked = b.stalledLocked(), true
				est = b.establishedLocked(now)
				b.mu.Unlock()
			}
			if c.claim() {
				c.finish(0, budgetError(stalled, est))
			}
			continue
		}
		if err := c.ctx.Err(); err != nil { // the caller is gone: do not send
			if c.claim() {
				c.finish(0, b.ctxError(err))
			}
			continue
		}
		if len(live) == 0 || c.deadline < earliest {
			earliest = c.deadline
		}
		deadline = max(deadline, c.deadline)
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	sc.ctx.deadline = b.epoch.Add(time.Duration(deadline))
	ctx := &sc.ctx
	on := b.on(slot, now)
	// The sweeper is needed if the flush outlives its earliest budget
	// (that call's answer is due) or a Timeout (a stall to report).
	wait := min(earliest-now, int64(b.timeout))
	b.alarms[slot].Store(now + wait)
	sc.timer.Reset(time.Duration(wait))
	defer sc.timer.Stop()
	invs := b.group(ctx, sc, live)
	b.pipeline(ctx, on, invs)
	b.retryNX(ctx, on, invs)
	defer b.flushed(slot, invs)
	// NOSCRIPT: the server does not have the script (first call, SCRIPT
	// FLUSH, restart, failover). Round 1 sends it once, as EVAL (which
	// caches it), followed by EVALSHA for the other invocations in the same
	// pipeline: Redis runs a connection's commands in order, so they find
	// it. Round 2 sends EVAL for any invocation still answered NOSCRIPT
	// (Cluster: one for another node than the first one's).
	for round := 1; round <= 2; round++ {
		var retry []*invocation
		for _, inv := range invs {
			if inv.cmd != nil && isNoScript(inv.cmd.Err()) {
				sha := round == 1 && len(retry) > 0
				inv.cmd = argsCmd(ctx, sha, segmentsOf(inv.calls))
				retry = append(retry, inv)
				continue
			}
			b.deliver(inv)
		}
		if len(retry) == 0 {
			return
		}
		b.pipeline(ctx, on, retry)
		invs = retry
	}
	for _, inv := range invs {
		b.deliver(inv)
	}
}

// group splits calls into invocations: one for all of them, or on Cluster
// one per hash slot (a script may only touch keys of one slot), keeping
// the calls' order within each. A single script invocation is sc's.
func (b *batcher) group(ctx context.Context, sc *slotConn, calls []*scriptCall) []*invocation {
	var nat *invocation
	if i := slices.IndexFunc(calls, func(c *scriptCall) bool { return c.native != nil }); i >= 0 {
		nat = &invocation{native: true}
		script := calls[:0:0]
		for _, c := range calls {
			if c.native != nil {
				nat.calls = append(nat.calls, c)
			} else {
				script = append(script, c)
			}
		}
		calls = script
	}
	invs := b.groupScript(ctx, sc, calls)
	if nat != nil {
		invs = append(invs, nat)
	}
	return invs
}

// groupScript is group for script calls.
func (b *batcher) groupScript(ctx context.Context, sc *slotConn, calls []*scriptCall) []*invocation {
	if len(calls) == 0 {
		return nil
	}
	split := false
	for _, c := range calls {
		if c.script() != calls[0].script() {
			split = true
			break
		}
	}
	if !b.cluster && !split {
		sc.inv = invocation{calls: calls, cmd: argsCmd(ctx, true, segmentsOf(calls))}
		sc.invs[0] = &sc.inv
		return sc.invs[:]
	}
	// One invocation per hash slot (Cluster) and script (window.lua or
	// the others).
	slices.SortStableFunc(calls, func(x, y *scriptCall) int {
		if c := cmp.Compare(x.slot, y.slot); c != 0 {
			return c
		}
		return cmp.Compare(x.script(), y.script())
	})
	var invs []*invocation
	for i := 0; i < len(calls); {
		j := i + 1
		for j < len(calls) && calls[j].slot == calls[i].slot && calls[j].script() == calls[i].script() {
			j++
		}
		g := calls[i:j:j]
		invs = append(invs, &invocation{calls: g, cmd: argsCmd(ctx, true, segmentsOf(g))})
		i = j
	}
	return invs
}

func segmentsOf(calls []*scriptCall) []*segArgs {
	segs := make([]*segArgs, len(calls))
	for i, c := range calls {
		segs[i] = &c.args
	}
	return segs
}

// pipeline runs the invocations' commands, in one pipeline when there are
// several; each command gets its own result or error.
//
// With waitReplicas > 0 (standalone and Sentinel only) each invocation is
// followed in the pipeline by WAIT waitReplicas Timeout: the replicas'
// acknowledgement of its writes (see Options.WaitReplicas).
func (b *batcher) pipeline(ctx context.Context, on processor, invs []*invocation) {
	wait := b.waitReplicas > 0 && !b.cluster
	if len(invs) == 1 && !wait && !invs[0].native {
		_ = on.Process(ctx, invs[0].cmd)
		return
	}
	p := on.Pipeline()
	noNX := b.noNX != nil && b.noNX.Load()
	for _, inv := range invs {
		if inv.native {
			for _, c := range inv.calls {
				c.native.queue(ctx, p, noNX)
			}
		} else {
			_ = p.Process(ctx, inv.cmd)
		}
		if wait {
			inv.wait = goredis.NewIntCmd(ctx, "wait", b.waitReplicas, max(1, b.timeout.Milliseconds()))
			_ = p.Process(ctx, inv.wait)
		}
	}
	_, _ = p.Exec(ctx)
}

// ErrNotReplicated is the error of the calls of an invocation whose writes
// fewer than Options.WaitReplicas replicas acknowledged within
// Options.Timeout (WAIT): Redis decided them, but a failover now could
// lose them, so the rules' failure modes answer instead (cause
// "readonly", like the NOREPLICAS refusal of min-replicas-to-write).
var ErrNotReplicated error = newError(CauseReadonly, false,
	errors.New("redis: decision not acknowledged by the required replicas (WAIT)"))

// deliver completes every call of the invocation from its reply: one line
// per segment (parseSegment), or the invocation's error for all of them.
// Calls abandoned by their caller or completed by the sweeper are skipped.
func (b *batcher) deliver(inv *invocation) {
	var err error
	if inv.cmd != nil {
		err = inv.cmd.Err()
	} else {
		err = inv.nativeTimeout()
	}
	// stalledFor: the invocation's context (the latest budget of its
	// calls) or a read timeout ended it; as for a budget that ran out, an
	// established stall, or one a call waited out, gives ErrStalled.
	stalledFor := func(*scriptCall) bool { return false }
	if err != nil && CauseOf(err) == CauseTimeout {
		b.mu.Lock()
		now := b.clock()
		stalled := b.stalledLocked()
		est := stalled && b.establishedLocked(now)
		b.mu.Unlock()
		stalledFor = func(c *scriptCall) bool {
			if est || !stalled {
				return est
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.waitedOutLocked(c, now, stalled)
		}
	}
	if err == nil && inv.wait != nil {
		if werr := inv.wait.Err(); werr != nil {
			err = werr
		} else if inv.wait.Val() < int64(b.waitReplicas) {
			err = ErrNotReplicated
		}
	}
	if inv.native {
		for _, c := range inv.calls {
			if !c.claim() {
				continue
			}
			switch {
			case err != nil && stalledFor(c):
				c.finish(0, ErrStalled)
			case err != nil:
				c.finish(0, err)
			default:
				c.finish(0, c.native.decide(c.out))
			}
		}
		return
	}
	if inv.calls[0].args.lean != nil {
		deliverLean(inv, err, stalledFor)
		return
	}
	if inv.calls[0].window {
		deliverWindow(inv, err, stalledFor)
		return
	}
	var r string
	if err == nil {
		var ok bool
		if r, ok = inv.cmd.Val().(string); !ok {
			err = fmt.Errorf("%w: %T", errReply, inv.cmd.Val())
		}
	}
	for _, c := range inv.calls {
		if !c.claim() {
			_, r, _ = strings.Cut(r, "\n")
			continue
		}
		if err != nil {
			if stalledFor(c) {
				c.finish(0, ErrStalled)
				continue
			}
			c.finish(0, err)
			continue
		}
		now, rest, perr := parseSegment(r, c.out)
		r = rest
		c.finish(now, perr)
	}
}

// isNoScript reports a NOSCRIPT error reply (the script cache was flushed,
// or the server restarted or failed over).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// retryNX sends PEXPIRE again without NX for the native calls of invs
// whose server refused NX (Redis 6), and makes every later native call
// do without it.
func (b *batcher) retryNX(ctx context.Context, on processor, invs []*invocation) {
	var retry []*scriptCall
	for _, inv := range invs {
		if !inv.native {
			continue
		}
		for _, c := range inv.calls {
			if c.native.refusedNX() {
				retry = append(retry, c)
			}
		}
	}
	if len(retry) == 0 {
		return
	}
	if b.noNX != nil {
		b.noNX.Store(true)
	}
	p := on.Pipeline()
	for _, c := range retry {
		for i, e := range c.native.exp {
			if e.Err() != nil && isArgError(e.Err()) {
				c.native.exp[i] = goredis.NewBoolCmd(ctx, "pexpire", c.native.keys[i], c.native.ttl[i])
				_ = p.Process(ctx, c.native.exp[i])
			}
		}
	}
	_, _ = p.Exec(ctx)
}

// nativeTimeout is the error of a native invocation whose pipeline timed
// out (its context ended, or a read timed out): the first command error
// with cause timeout, nil if none. Other command errors (replies such as
// OOM) reach their own call only (nativeCall.decide).
func (inv *invocation) nativeTimeout() error {
	for _, c := range inv.calls {
		for i := range c.native.incr {
			for _, err := range []error{c.native.incr[i].Err(), c.native.exp[i].Err()} {
				if err != nil && CauseOf(err) == CauseTimeout {
					return err
				}
			}
		}
	}
	return nil
}
