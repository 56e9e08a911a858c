package redis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultPipelines is the number of pipelines a Store keeps in flight at
// once (Options.Pipelines when 0).
const DefaultPipelines = 4

// maxBatch bounds the commands of one pipeline (one write and one read of
// about 64 bytes × hits per command each way).
const maxBatch = 256

// batcher pipelines the script calls of concurrent requests: a call is
// queued, and up to `pipelines` flush loops each take everything queued (at
// most maxBatch calls) and send it as one go-redis pipeline on one pooled
// connection (Cluster: split per node by go-redis), so under load a
// request costs a share of one write and one read syscall and no
// connection of its own. Under light load a call finds a free flush loop
// and goes out alone at once (no coalescing wait).
//
// Unlike go-redis' AutoPipeliner, every caller stops waiting when its own
// context ends (its deadline: min(caller's deadline, Options.Timeout)),
// whatever the pipeline it rides does: a call never waits for another
// call's timeout. Calls whose context ended while queued are not sent. A
// pipeline is bounded by the latest deadline of its calls and by the
// client's read/write timeouts (Options.Timeout), so a stuck Redis holds a
// flush loop for at most one Timeout.
type batcher struct {
	client    goredis.UniversalClient
	pipelines int

	mu       sync.Mutex
	queue    []*scriptCall
	spare    []*scriptCall // the previous queue's backing array, for reuse
	inFlight int           // running flush loops
	wg       sync.WaitGroup
	closed   bool
}

// scriptCall is one queued script call.
type scriptCall struct {
	ctx  context.Context
	cmd  *goredis.Cmd
	keys []string
	args []any
	done chan struct{} // closed once cmd holds its result
}

func newBatcher(c goredis.UniversalClient, pipelines int) *batcher {
	if pipelines < 1 {
		pipelines = DefaultPipelines
	}
	return &batcher{client: c, pipelines: pipelines}
}

// errClosed is the error of a call made after Close.
var errClosed = errors.New("redis: store closed")

// do runs the script with keys and args (EVALSHA, then EVAL when the
// server answers NOSCRIPT) and returns its reply, or the go-redis error,
// or ctx's error when ctx ends first.
func (b *batcher) do(ctx context.Context, keys []string, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &scriptCall{ctx: ctx, keys: keys, args: args, cmd: evalCmd(ctx, true, keys, args), done: make(chan struct{})}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errClosed
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
		return c.cmd.Result()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close stops accepting calls and waits for the flush loops to end (each
// within one Timeout).
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// flushLoop sends the queue as pipelines until it is empty.
func (b *batcher) flushLoop() {
	defer b.wg.Done()
	var batch []*scriptCall
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
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

// exec sends the live calls of batch as one pipeline (a second one with
// EVAL for the calls answered NOSCRIPT) and completes every call.
func (b *batcher) exec(batch []*scriptCall) {
	live := batch[:0:0]
	var deadline time.Time
	for _, c := range batch {
		if c.ctx.Err() != nil { // the caller is gone: do not send
			c.cmd.SetErr(c.ctx.Err())
			close(c.done)
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
	b.pipeline(ctx, live)
	// NOSCRIPT: the server does not have the script (first call, SCRIPT
	// FLUSH, restart, failover). Round 1 sends it once, as EVAL (which
	// caches it), followed by EVALSHA for the other calls in the same
	// pipeline: Redis runs a connection's commands in order, so they find
	// it (a burst does not send the 20 KiB script once per call). Round 2
	// sends EVAL for any call still answered NOSCRIPT (Cluster: a call for
	// another node than the first one's).
	for round := 1; round <= 2; round++ {
		var retry []*scriptCall
		for _, c := range live {
			if isNoScript(c.cmd.Err()) {
				sha := round == 1 && len(retry) > 0
				c.cmd = evalCmd(c.ctx, sha, c.keys, c.args)
				retry = append(retry, c)
				continue
			}
			close(c.done)
		}
		if len(retry) == 0 {
			return
		}
		b.pipeline(ctx, retry)
		live = retry
	}
	for _, c := range live {
		close(c.done)
	}
}

// pipeline runs the commands of calls in one pipeline; each command gets
// its own result or error.
func (b *batcher) pipeline(ctx context.Context, calls []*scriptCall) {
	if len(calls) == 1 {
		_ = b.client.Process(ctx, calls[0].cmd)
		return
	}
	p := b.client.Pipeline()
	for _, c := range calls {
		_ = p.Process(ctx, c.cmd)
	}
	_, _ = p.Exec(ctx)
}

// evalCmd is the script call as EVALSHA (sha) or EVAL: command, SHA1 or
// script, numkeys, keys, args. The first key is at position 3 (Cluster
// routing).
func evalCmd(ctx context.Context, sha bool, keys []string, args []any) *goredis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	if sha {
		a = append(a, "evalsha", takeScript.Hash())
	} else {
		a = append(a, "eval", takeLua)
	}
	a = append(a, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// isNoScript reports a NOSCRIPT error reply (the script cache was flushed,
// or the server restarted or failed over).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
