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
// Unlike go-redis' AutoPipeliner, every caller stops waiting when its own
// context ends (its deadline: min(caller's deadline, Options.Timeout)),
// whatever the invocation it rides does: a call never waits for another
// call's timeout. Calls whose context ended while queued are not sent. A
// flush is bounded by the latest deadline of its calls and by the client's
// read/write timeouts (Options.Timeout), so a stuck Redis holds a flush
// loop for at most one Timeout. An error of the invocation (timeout,
// refused, OOM, READONLY, NOSCRIPT after the retry...) reaches every call
// of it; an error the script reports for one segment reaches that call
// only (SegmentError).
type batcher struct {
	client    goredis.UniversalClient
	pipelines int
	cluster   bool // group by hash slot: one invocation per slot

	mu       sync.Mutex
	queue    []*scriptCall
	spare    []*scriptCall // the previous queue's backing array, for reuse
	inFlight int           // running flush loops
	wg       sync.WaitGroup
	closed   bool
}

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
	ctx   context.Context
	seg   segment
	slot  uint16          // Cluster: the hash slot of every key of seg
	out   []algo.Decision // the segment's decisions, written on success
	now   int64           // the segment's now in µs, on success
	err   error
	state atomic.Int32
	done  chan struct{} // closed once claimed and completed
}

func (c *scriptCall) claim() bool { return c.state.CompareAndSwap(callPending, callClaimed) }

// finish completes a claimed call.
func (c *scriptCall) finish(now int64, err error) {
	c.now, c.err = now, err
	close(c.done)
}

func newBatcher(c goredis.UniversalClient, pipelines int) *batcher {
	if pipelines < 1 {
		pipelines = DefaultPipelines
	}
	_, cluster := c.(*goredis.ClusterClient)
	return &batcher{client: c, pipelines: pipelines, cluster: cluster}
}

// errClosed is the error of a call made after Close.
var errClosed = errors.New("redis: store closed")

// do decides seg (EVALSHA, then EVAL when the server answers NOSCRIPT),
// batched with the segments of concurrent calls, writes its decisions into
// out (len(out) == len(seg.hits)) and returns the segment's now in µs; or
// the go-redis error of the invocation, or the segment's SegmentError, or
// ctx's error when ctx ends first (out is then left untouched).
func (b *batcher) do(ctx context.Context, seg segment, out []algo.Decision) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c := &scriptCall{ctx: ctx, seg: seg, out: out, done: make(chan struct{})}
	if b.cluster && len(seg.hits) > 0 {
		c.slot = Slot(seg.hits[0].Key)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, errClosed
	}
	b.queue = append(b.queue, c)
	start := b.inFlight < b.pipelines
	if start {
		b.inFlight++
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if start {
		go b.flushLoop()
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

// close stops accepting calls and waits for the flush loops to end (each
// within one Timeout).
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// flushLoop sends the queue as script invocations until it is empty.
func (b *batcher) flushLoop() {
	defer b.wg.Done()
	var batch []*scriptCall
	for {
		b.mu.Lock()
		n, hits := 0, 0
		for n < len(b.queue) && n < maxBatch {
			h := len(b.queue[n].seg.hits)
			if n > 0 && hits+h > maxBatchHits {
				break
			}
			hits += h
			n++
		}
		if n == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		batch = append(batch[:0], b.queue[:n]...)
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
		clear(batch)
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
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil { // the caller is gone: do not send
			if c.claim() {
				c.finish(0, err)
			}
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
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
				inv.cmd = scriptCmd(ctx, sha, segmentsOf(inv.calls))
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
		return []*invocation{{calls: calls, cmd: scriptCmd(ctx, true, segmentsOf(calls))}}
	}
	slices.SortStableFunc(calls, func(x, y *scriptCall) int { return cmp.Compare(x.slot, y.slot) })
	var invs []*invocation
	for i := 0; i < len(calls); {
		j := i + 1
		for j < len(calls) && calls[j].slot == calls[i].slot {
			j++
		}
		g := calls[i:j:j]
		invs = append(invs, &invocation{calls: g, cmd: scriptCmd(ctx, true, segmentsOf(g))})
		i = j
	}
	return invs
}

func segmentsOf(calls []*scriptCall) []*segment {
	segs := make([]*segment, len(calls))
	for i, c := range calls {
		segs[i] = &c.seg
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
			r = skipLine(r)
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

// skipLine is r after its first "\n" ("" when there is none).
func skipLine(r string) string {
	if i := strings.IndexByte(r, '\n'); i >= 0 {
		return r[i+1:]
	}
	return ""
}

// isNoScript reports a NOSCRIPT error reply (the script cache was flushed,
// or the server restarted or failed over).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
