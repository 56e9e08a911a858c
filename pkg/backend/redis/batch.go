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
// once (Options.Pipelines when 0). Two rather than more: fewer flushes in
// flight make larger batches, and a larger batch costs Redis less CPU per
// decision (internal/redise2e BenchmarkShouldRateLimitRedis: 2 gave about
// 20% more decisions/s and a lower p99 than 4, see docs/redis.md).
const DefaultPipelines = 2

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
// Unlike go-redis' AutoPipeliner, every caller stops waiting at its own
// deadline, min(its context's deadline, enqueue time + Options.Timeout),
// whatever the invocation it rides does: a call never waits for another
// call's timeout. The context's end is watched by the caller itself; the
// Timeout is enforced without a runtime timer per call: one sweeper
// goroutine per batcher, running while calls are pending, completes every
// queued or in-flight call whose Timeout has passed (with ErrCallTimeout)
// every sweepTick. A caller therefore waits at most sweepTick (plus
// scheduling) past its Timeout, and never past its context's deadline by
// more than scheduling. Calls whose deadline passed while queued are not
// sent. A flush is bounded by the latest deadline of its calls and by the
// client's read/write timeouts (Options.Timeout), so a stuck Redis holds a
// flush loop for at most one Timeout. An error of the invocation (timeout,
// refused, OOM, READONLY, NOSCRIPT after the retry...) reaches every call
// of it; an error the script reports for one segment reaches that call
// only (SegmentError).
type batcher struct {
	client    goredis.UniversalClient
	pipelines int
	cluster   bool          // group by hash slot: one invocation per slot
	timeout   time.Duration // per call from enqueueing (0: none)
	tick      time.Duration // the sweeper's period
	epoch     time.Time     // origin of scriptCall.deadline (monotonic)

	mu       sync.Mutex
	queue    []*scriptCall
	spare    []*scriptCall   // the previous queue's backing array, for reuse
	flights  [][]*scriptCall // per flush loop slot: the batch in flight
	busy     []bool          // per flush loop slot: a loop runs in it
	inFlight int             // running flush loops
	sweeping bool            // the sweeper runs
	wg       sync.WaitGroup
	closed   bool
}

// sweepTick is the sweeper's period for a Timeout: a tenth of it, between
// 100 µs and 1 ms. It is the slack of the Timeout (see batcher).
func sweepTick(timeout time.Duration) time.Duration {
	return min(time.Millisecond, max(100*time.Microsecond, timeout/10))
}

// sweepIdleTicks is how many ticks without a pending call the sweeper
// waits for before it ends (a new call starts it again).
const sweepIdleTicks = 64

// ErrCallTimeout is the error of a call that got no reply within
// Options.Timeout (its cause is CauseTimeout; errors.Is
// context.DeadlineExceeded).
var ErrCallTimeout error = &Error{cause: CauseTimeout, outage: true,
	err: fmt.Errorf("redis: no reply within the timeout: %w", context.DeadlineExceeded)}

// Call states: a flush completes a pending call only after claiming it,
// and a caller leaving at its deadline abandons it, so the flush never
// writes into a caller's decisions after the caller returned.
const (
	callPending int32 = iota
	callClaimed
	callAbandoned
)

// scriptCall is one queued segment and, once done is closed, its result.
type scriptCall struct {
	ctx      context.Context
	deadline int64           // ns since batcher.epoch; 0: none
	args     segArgs         // the segment's script arguments
	slot     uint16          // Cluster: the hash slot of every key of seg
	out      []algo.Decision // the segment's decisions, written on success
	now      int64           // the segment's now in µs, on success
	err      error
	state    atomic.Int32
	done     chan struct{} // closed once claimed and completed
}

// newCall is a pending call deciding seg into out.
func newCall(ctx context.Context, seg *segment, out []algo.Decision) *scriptCall {
	c := &scriptCall{ctx: ctx, out: out, done: make(chan struct{})}
	c.args.init(seg)
	return c
}

func (c *scriptCall) claim() bool { return c.state.CompareAndSwap(callPending, callClaimed) }

// finish completes a claimed call.
func (c *scriptCall) finish(now int64, err error) {
	c.now, c.err = now, err
	close(c.done)
}

// newBatcher batches script calls on c with at most pipelines flushes in
// flight (< 1: DefaultPipelines); timeout bounds every call from its
// enqueueing (0: only the caller's context does).
func newBatcher(c goredis.UniversalClient, pipelines int, timeout time.Duration) *batcher {
	if pipelines < 1 {
		pipelines = DefaultPipelines
	}
	_, cluster := c.(*goredis.ClusterClient)
	return &batcher{
		client: c, pipelines: pipelines, cluster: cluster,
		timeout: max(0, timeout), tick: sweepTick(timeout), epoch: time.Now(),
		flights: make([][]*scriptCall, pipelines), busy: make([]bool, pipelines),
	}
}

// clock is the monotonic time in ns since b.epoch.
func (b *batcher) clock() int64 { return int64(time.Since(b.epoch)) }

// errClosed is the error of a call made after Close.
var errClosed = errors.New("redis: store closed")

// do decides seg (EVALSHA, then EVAL when the server answers NOSCRIPT),
// batched with the segments of concurrent calls, writes its decisions into
// out (len(out) == len(seg.hits)) and returns the segment's now in µs; or
// the go-redis error of the invocation, or the segment's SegmentError, or
// ctx's error when ctx ends first, or ErrCallTimeout when the batcher's
// timeout passes first (out is then left untouched).
func (b *batcher) do(ctx context.Context, seg segment, out []algo.Decision) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c := newCall(ctx, &seg, out)
	if b.timeout > 0 {
		c.deadline = b.clock() + int64(b.timeout)
	}
	if b.cluster && len(seg.hits) > 0 {
		c.slot = Slot(seg.hits[0].Key)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, errClosed
	}
	b.queue = append(b.queue, c)
	slot := -1
	if b.inFlight < b.pipelines {
		slot = slices.Index(b.busy, false)
		b.busy[slot] = true
		b.inFlight++
		b.wg.Add(1)
	}
	sweep := !b.sweeping && b.timeout > 0
	if sweep {
		b.sweeping = true
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if slot >= 0 {
		go b.flushLoop(slot)
	}
	if sweep {
		go b.sweeper()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return 0, ctx.Err()
		}
		<-c.done // claimed: the result is being written now
	}
	return c.now, c.err
}

// sweeper completes, every tick, the pending calls (queued or in flight)
// whose timeout has passed; it ends after sweepIdleTicks ticks without a
// pending call, or once the batcher is closed and nothing is pending.
func (b *batcher) sweeper() {
	defer b.wg.Done()
	t := time.NewTicker(b.tick)
	defer t.Stop()
	idle := 0
	for range t.C {
		now := b.clock()
		b.mu.Lock()
		pending := b.sweepLocked(b.queue, now)
		for _, f := range b.flights {
			pending += b.sweepLocked(f, now)
		}
		if pending > 0 {
			idle = 0
		} else {
			idle++
		}
		if pending == 0 && (b.closed || idle >= sweepIdleTicks) {
			b.sweeping = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
}

// sweepLocked completes the calls of cs whose deadline is at or before now
// with ErrCallTimeout and returns how many of the others are still
// pending. b.mu is held.
func (b *batcher) sweepLocked(cs []*scriptCall, now int64) int {
	pending := 0
	for _, c := range cs {
		if c.state.Load() != callPending {
			continue
		}
		if c.deadline == 0 || c.deadline > now {
			pending++
			continue
		}
		if c.claim() {
			c.finish(0, ErrCallTimeout)
		}
	}
	return pending
}

// close stops accepting calls and waits for the flush loops to end (each
// within one Timeout).
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// flushLoop sends the queue as script invocations until it is empty. slot
// is its index in b.flights and b.busy.
func (b *batcher) flushLoop(slot int) {
	defer b.wg.Done()
	var batch []*scriptCall
	for {
		b.mu.Lock()
		clear(batch) // under mu: the sweeper reads b.flights[slot]
		n, hits := 0, 0
		for n < len(b.queue) && n < maxBatch {
			h := b.queue[n].args.hits()
			if n > 0 && hits+h > maxBatchHits {
				break
			}
			hits += h
			n++
		}
		if n == 0 {
			b.inFlight--
			b.busy[slot] = false
			b.flights[slot] = nil
			b.mu.Unlock()
			return
		}
		batch = append(batch[:0], b.queue[:n]...)
		b.flights[slot] = batch
		if n == len(b.queue) {
			// Swap in the spare backing array so that the next calls do not
			// reallocate the queue.
			clear(b.queue)
			b.queue, b.spare = b.spare[:0], b.queue[:0]
		} else {
			b.queue = append(b.queue[:0], b.queue[n:]...)
		}
		b.mu.Unlock()
		b.exec(batch)
	}
}

// invocation is the script invocation of one group of calls (all of them
// on standalone/Sentinel; one hash slot's on Cluster).
type invocation struct {
	calls []*scriptCall
	cmd   *goredis.Cmd
}

// exec sends the live calls of batch as one script invocation per group
// (several in one pipeline on Cluster; a second round with EVAL for the
// invocations answered NOSCRIPT) and completes every call.
func (b *batcher) exec(batch []*scriptCall) {
	live := make([]*scriptCall, 0, len(batch))
	var deadline time.Time
	now := b.clock()
	for _, c := range batch {
		if c.state.Load() != callPending { // abandoned, or timed out by the sweeper
			continue
		}
		if c.deadline != 0 && c.deadline <= now {
			if c.claim() {
				c.finish(0, ErrCallTimeout)
			}
			continue
		}
		if err := c.ctx.Err(); err != nil { // the caller is gone: do not send
			if c.claim() {
				c.finish(0, err)
			}
			continue
		}
		d, ok := c.ctx.Deadline()
		if c.deadline != 0 {
			if own := b.epoch.Add(time.Duration(c.deadline)); !ok || own.Before(d) {
				d, ok = own, true
			}
		}
		if ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	invs := b.group(ctx, live)
	b.pipeline(ctx, invs)
	// NOSCRIPT: the server does not have the script (first call, SCRIPT
	// FLUSH, restart, failover). Round 1 sends it once, as EVAL (which
	// caches it), followed by EVALSHA for the other invocations in the same
	// pipeline: Redis runs a connection's commands in order, so they find
	// it. Round 2 sends EVAL for any invocation still answered NOSCRIPT
	// (Cluster: one for another node than the first one's).
	for round := 1; round <= 2; round++ {
		var retry []*invocation
		for _, inv := range invs {
			if isNoScript(inv.cmd.Err()) {
				sha := round == 1 && len(retry) > 0
				inv.cmd = argsCmd(ctx, sha, segmentsOf(inv.calls))
				retry = append(retry, inv)
				continue
			}
			inv.deliver()
		}
		if len(retry) == 0 {
			return
		}
		b.pipeline(ctx, retry)
		invs = retry
	}
	for _, inv := range invs {
		inv.deliver()
	}
}

// group splits calls into invocations: one for all of them, or on Cluster
// one per hash slot (a script may only touch keys of one slot), keeping
// the calls' order within each.
func (b *batcher) group(ctx context.Context, calls []*scriptCall) []*invocation {
	if !b.cluster {
		return []*invocation{{calls: calls, cmd: argsCmd(ctx, true, segmentsOf(calls))}}
	}
	slices.SortStableFunc(calls, func(x, y *scriptCall) int { return cmp.Compare(x.slot, y.slot) })
	var invs []*invocation
	for i := 0; i < len(calls); {
		j := i + 1
		for j < len(calls) && calls[j].slot == calls[i].slot {
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
func (b *batcher) pipeline(ctx context.Context, invs []*invocation) {
	if len(invs) == 1 {
		_ = b.client.Process(ctx, invs[0].cmd)
		return
	}
	p := b.client.Pipeline()
	for _, inv := range invs {
		_ = p.Process(ctx, inv.cmd)
	}
	_, _ = p.Exec(ctx)
}

// deliver completes every call of the invocation from its reply: one line
// per segment (parseSegment), or the invocation's error for all of them.
// Calls abandoned by their caller are skipped.
func (inv *invocation) deliver() {
	err := inv.cmd.Err()
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
