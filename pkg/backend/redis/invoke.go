package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

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
	// fcall: cmd is the FCALL of window1Func.
	fcall bool
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
	sc.ctx.deadline = b.wall(deadline)
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
	b.retryFcall(ctx, on, invs)
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
		sc.inv = invocation{calls: calls}
		sc.inv.cmd, sc.inv.fcall = b.argsFirst(ctx, segmentsOf(calls))
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
		inv := &invocation{calls: g}
		inv.cmd, inv.fcall = b.argsFirst(ctx, segmentsOf(g))
		invs = append(invs, inv)
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
	for _, inv := range invs {
		if inv.native {
			for _, c := range inv.calls {
				c.native.queue(ctx, p)
			}
		} else {
			_ = p.Process(ctx, inv.cmd)
		}
		if wait {
			inv.wait = goredis.NewIntCmd(ctx, "wait", b.waitReplicas, max(1, b.timeout.Milliseconds()))
			_ = p.Process(ctx, inv.wait)
		}
	}
	stampUnsent(p.Exec(ctx))
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

// argsFirst is the first command deciding segs: the FCALL of window1Func
// for a lone window decision once the master has it (fcall), else
// EVALSHA.
func (b *batcher) argsFirst(ctx context.Context, segs []*segArgs) (cmd *goredis.Cmd, fcall bool) {
	if segs[0].win != nil && b.fn.fcall() && windowLone(segs) {
		return argsWindowFcall(ctx, segs[0]), true
	}
	return argsCmd(ctx, true, segs), false
}

// retryFcall sends again, as EVALSHA of window1.lua (which exec sends as
// EVAL on NOSCRIPT), the FCALL invocations of invs that the server
// refused: a missing function (FUNCTION FLUSH, a restart, a failover:
// the master is marked for a reload by the next warm-up or health tick),
// no permission or command (the master keeps EVALSHA, logged once, until
// the health probe finds functions granted, see FnRetry), or
// OOM (a function is refused whole under OOM, while window1.lua still
// denies a hit over the limit from a GET). None of these is a backend
// failure: the call is decided by the script instead.
func (b *batcher) retryFcall(ctx context.Context, on processor, invs []*invocation) {
	var retry []*invocation
	for _, inv := range invs {
		if !inv.fcall {
			continue
		}
		err := inv.cmd.Err()
		switch {
		case err == nil:
			continue
		case isFnMissing(err):
			b.fn.reload.Store(true)
		case isFnRefused(err):
			b.fn.refuse(ctx, b.fnName, err, b.now())
		case strings.HasPrefix(err.Error(), "OOM "):
		default:
			continue
		}
		inv.cmd, inv.fcall = argsCmd(ctx, true, segmentsOf(inv.calls)), false
		retry = append(retry, inv)
	}
	if len(retry) > 0 {
		b.pipeline(ctx, on, retry)
	}
}

// isNoScript reports a NOSCRIPT error reply (the script cache was flushed,
// or the server restarted or failed over).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
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
