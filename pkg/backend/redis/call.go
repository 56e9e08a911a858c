package redis

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

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
		c.native = newNativeCall(seg.hits, seg.nowUS, seg.slack)
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
