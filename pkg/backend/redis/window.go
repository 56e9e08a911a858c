package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// windowLua decides fixed_window hits whose key carries the window
// (Options.WindowKeys): INCRBY on "<key>:<window_start_us>", PEXPIRE
// when the key is created, DECRBY when the hit is denied; no read of the
// value before the write on a request's single hit, one class table
// (rate, period, window start, TTL) per invocation, an integer-array
// reply.
//
//go:embed window.lua
var windowLua string

// windowScript is windowLua's handle.
var windowScript = goredis.NewScript(windowLua)

// WindowScriptSHA is the SHA1 of the embedded window-key script, which
// Warm loads next to the others.
func WindowScriptSHA() string { return windowScript.Hash() }

// window1Lua decides a lone window take of one hit (windowLone), the
// usual call at low load: what windowLua does for such a hit, in a
// script of its own, because Redis' work per call grows with the size
// of the script it runs. It replies the count.
//
//go:embed window1.lua
var window1Lua string

// window1Script is window1Lua's handle.
var window1Script = goredis.NewScript(window1Lua)

var (
	argSHAW     any = windowScript.Hash()
	argScriptW  any = windowLua
	argSHAW1    any = window1Script.Hash()
	argScriptW1 any = window1Lua
)

// errStaleWindow is a window segment's status when the window its keys
// carry is not the server's current one: nothing was written, and the
// Store sends it again with the server's now (Store.run).
var errStaleWindow = errors.New("redis: window of the keys is not the server's")

// windowKind reports whether h is counted under a window key when
// Options.WindowKeys is on: a fixed_window limit without a calendar,
// 1 <= rate < 2^53, 1 <= period < 2^53 µs, on a key that can carry a
// window suffix in the same hash slot (windowKey), without a penalty box
// (take.lua decides those). The answer depends on
// the limit and the key only, so every request counts a given limit the
// same way.
func windowKind(h *algo.Hit) bool {
	l := &h.Limit
	p := l.Period.Microseconds()
	return l.Kind == algo.FixedWindow && l.Calendar == algo.CalendarNone && !h.Penalty.On() &&
		l.Rate >= 1 && l.Rate < algo.MaxExact && p >= 1 && p < algo.MaxExact &&
		windowKeyable(h.Key)
}

// windowKeyable reports whether windowKey keeps key's hash slot: key has
// a hash tag, or has no '}' (so that "{key}" tags all of it).
func windowKeyable(key string) bool {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return true
		}
	}
	return strings.IndexByte(key, '}') < 0
}

// windowKeyVersion is the element between a key and its window start:
// a version of the window-key layout, so that keys written by another
// layout (the key alone, "<key>:<ws>" of earlier releases, the native
// "<key>:<ws base 36>") never name the same Redis key as this one.
const windowKeyVersion = ":v2:"

// windowKey is the key of key's counter in the window starting at ws
// (µs): "<key>:v2:<ws>" when key has a hash tag, else "{<key>}:v2:<ws>";
// both hash to Slot(key).
// The key is built in a stack buffer when it fits, so that the string is
// its only allocation.
func windowKey(key string, ws int64) string {
	var buf [128]byte
	b := buf[:0]
	if i := strings.IndexByte(key, '{'); i >= 0 && strings.IndexByte(key[i+1:], '}') > 0 {
		b = append(b, key...)
	} else {
		b = append(b, '{')
		b = append(b, key...)
		b = append(b, '}')
	}
	b = append(b, windowKeyVersion...)
	return string(strconv.AppendInt(b, ws, 10))
}

// winArgs is a window segment's script arguments (see segArgs).
type winArgs struct {
	keys []string
	// per hit: rate, period_us, window start, flags (1 release, 2 soft,
	// 4 charge), cost
	rate, period, ws, flags, cost []int64
	at                            int64 // the instant (µs) the keys' windows contain
	ttl                           int64 // the first hit's TTL (ms), sent by argsWindowDirect
	slack                         int64 // extra TTL ms (pinnedSlackMs with a pinned clock)
}

// Window hit code bits above the flags (see window.lua): the next hit
// belongs to the same segment, the segment's mode; the class id is the
// code divided by windowClassUnit.
const (
	windowJoin      = 8
	windowDenied    = 16
	windowRefund    = 32
	windowClassUnit = 64
)

// windowTTLSlack is added to a window key's TTL (one period): the key
// outlives its window by more than any instance's estimate of the
// server's clock may lag (see Store.windowNow), so a late hit still finds
// the window's count.
const windowTTLSlack = 1000 // ms

// windowTTL is the TTL (ms) of a window key of a period of p µs, plus
// slack (see winArgs.slack).
func windowTTL(p, slack int64) int64 { return (p+999)/1000 + windowTTLSlack + slack }

// argTrust marks a window segment that counts in the windows its keys
// name without the server's TIME (segArgs.now; argServerNow: check).
var argTrust any = "-"

// initWindow fills a.win from sg: the keys of the windows containing
// at (sg.nowUS when pinned, else the estimate of the server's now).
func (a *segArgs) initWindow(sg *segment) {
	n := len(sg.hits)
	at := sg.nowUS
	// A segment of one hit (a request's usual window segment) keeps its
	// arguments in a's buffers; larger ones allocate.
	a.winBuf = winArgs{}
	w := &a.winBuf
	if at < 0 {
		at = sg.estUS
	} else {
		w.slack = pinnedSlackMs
	}
	w.at = at
	var ints []int64
	if n <= len(a.keyBuf) && 5*n <= len(a.intBuf) {
		w.keys, ints = a.keyBuf[:n], a.intBuf[:5*n]
	} else {
		w.keys, ints = make([]string, n), make([]int64, 5*n)
	}
	w.rate, w.period, w.ws, w.flags, w.cost = ints[:n], ints[n:2*n], ints[2*n:3*n], ints[3*n:4*n], ints[4*n:]
	var mode int64
	switch sg.mode {
	case modeDenied:
		mode = windowDenied
	case modeRefund:
		mode = windowRefund
	}
	for i := range sg.hits {
		h := &sg.hits[i]
		p := h.Limit.Period.Microseconds()
		ws := at - at%p
		if at < 0 {
			ws = at - (at%p+p)%p
		}
		f := mode
		if h.Release {
			f |= 1
		}
		if h.Soft {
			f |= 2
		}
		if h.Charge {
			f |= 4
		}
		if i < n-1 {
			f |= windowJoin
		}
		w.keys[i] = windowKey(h.Key, ws)
		w.rate[i], w.period[i], w.ws[i], w.flags[i], w.cost[i] = h.Limit.Rate, p, ws, f, algo.ClampCost(h.Cost)
	}
	if n > 0 {
		w.ttl = windowTTL(w.period[0], w.slack)
	}
	a.win = w
	a.keys = w.keys
	a.now = argTrust
	if sg.check {
		a.now = argServerNow
	}
}

// windowDirect reports whether segs go out in window.lua's short
// layouts: no check of the windows, every segment a take of one hit
// (soft or not) of one class (rate, period, window start), with a cost
// from 1 to 10^15; ones: every cost is 1.
func windowDirect(segs []*segArgs) (direct, ones bool) {
	ones = true
	w0 := segs[0].win
	for _, sg := range segs {
		w := sg.win
		if sg.now == argServerNow || len(w.keys) != 1 || w.flags[0]&^2 != 0 ||
			w.cost[0] < 1 || w.cost[0] >= 1e15 ||
			w.rate[0] != w0.rate[0] || w.period[0] != w0.period[0] || w.ws[0] != w0.ws[0] {
			return false, false
		}
		ones = ones && w.cost[0] == 1
	}
	return true, ones
}

// windowLone reports whether segs go out as one window1.lua call: a
// lone windowDirect segment.
func windowLone(segs []*segArgs) bool {
	if len(segs) != 1 {
		return false
	}
	direct, _ := windowDirect(segs)
	return direct
}

// windowCount is the decision code (remaining * 2 + allowed, as
// window.lua replies) of a hit of w whose count after its INCRBY is v,
// window1.lua's reply: allowed when v is within the rate, else denied
// with what remained before it.
func windowCount(w *winArgs, v int64) int64 {
	rate := w.rate[0]
	if v <= rate {
		return (rate-v)*2 + 1
	}
	return max(rate-v+w.cost[0], 0) * 2
}

// windowClass is one row of an invocation's class table.
type windowClass struct{ rate, period, ws, ttl int64 }

// argsWindow is one window.lua invocation (EVALSHA or EVAL) deciding
// segs, which are all window segments: the class table (each distinct
// rate, period, window start and TTL once: rate and TTL, plus period and
// window start when the server checks the windows), then a class id with
// flags and a cost per hit. The server reads its TIME and checks the
// windows when a segment asks (segment.check).
func argsWindow(ctx context.Context, sha bool, segs []*segArgs) *goredis.Cmd {
	nkeys := 0
	now := argTrust
	for _, sg := range segs {
		nkeys += len(sg.win.keys)
		if sg.now == argServerNow {
			now = argServerNow
		}
	}
	if direct, ones := windowDirect(segs); direct {
		return argsWindowDirect(ctx, sha, segs, ones)
	}
	var classes []windowClass
	codes := make([]int64, 0, nkeys)
	for _, sg := range segs {
		w := sg.win
		for i := range w.keys {
			c := windowClass{w.rate[i], w.period[i], w.ws[i], windowTTL(w.period[i], w.slack)}
			id := -1
			for j := len(classes) - 1; j >= 0; j-- {
				if classes[j] == c {
					id = j
					break
				}
			}
			if id < 0 {
				id = len(classes)
				classes = append(classes, c)
			}
			codes = append(codes, int64(id)*windowClassUnit+w.flags[i])
		}
	}
	a := make([]any, 0, 4+nkeys+4*len(classes)+2*nkeys)
	if sha {
		a = append(a, argEvalSHA, argSHAW)
	} else {
		a = append(a, argEval, argScriptW)
	}
	a = append(a, int64(nkeys))
	for _, sg := range segs {
		for i := range sg.win.keys {
			a = append(a, &sg.win.keys[i])
		}
	}
	if now == argServerNow {
		a = append(a, -int64(len(classes)))
		for _, c := range classes {
			a = append(a, c.rate, c.ttl, c.period, c.ws)
		}
	} else {
		a = append(a, int64(len(classes)))
		for _, c := range classes {
			a = append(a, c.rate, c.ttl)
		}
	}
	k := 0
	for _, sg := range segs {
		for i := range sg.win.keys {
			a = append(a, &codes[k], &sg.win.cost[i])
			k++
		}
	}
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// argsWindowDirect is argsWindow for windowDirect segments: keys, the
// class's rate and TTL, and the costs unless they are all 1. A lone
// segment goes to window1.lua, which takes the same arguments.
func argsWindowDirect(ctx context.Context, sha bool, segs []*segArgs, ones bool) *goredis.Cmd {
	n := 5 + 2*len(segs)
	if ones {
		n -= len(segs)
	}
	a := make([]any, 0, n)
	switch {
	case len(segs) == 1 && sha:
		a = append(a, argEvalSHA, argSHAW1)
	case len(segs) == 1:
		a = append(a, argEval, argScriptW1)
	case sha:
		a = append(a, argEvalSHA, argSHAW)
	default:
		a = append(a, argEval, argScriptW)
	}
	a = append(a, int64(len(segs)))
	for _, sg := range segs {
		a = append(a, &sg.win.keys[0])
	}
	w := segs[0].win
	a = append(a, &w.rate[0], &w.ttl)
	if !ones {
		for _, sg := range segs {
			a = append(a, &sg.win.cost[0])
		}
	}
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// deliverWindow completes the calls of a window invocation from its
// reply (see window.lua and window1.lua), or with err: ErrStalled for the
// calls stalledFor reports (see batcher.deliver). A call's now is the
// server's TIME when the invocation read it, else the instant its keys
// were computed at.
func deliverWindow(inv *invocation, err error, stalledFor func(*scriptCall) bool) {
	var r []any
	var now int64
	count := int64(-1) // window1.lua's count
	if err == nil {
		segs := segmentsOf(inv.calls)
		direct, _ := windowDirect(segs)
		val := inv.cmd.Val()
		switch v := val.(type) {
		case int64: // window1.lua's count
			count = v
			if !windowLone(segs) || v < 0 {
				err = fmt.Errorf("%w: count %d for %d window segments", errReply, v, len(inv.calls))
			}
		case []any:
			r = v
			if !direct && len(r) < 1 {
				err = fmt.Errorf("%w: empty window reply", errReply)
			} else if !direct {
				now, _ = r[0].(int64)
				r = r[1:]
			}
		default:
			err = fmt.Errorf("%w: %T", errReply, inv.cmd.Val())
		}
	}
	for _, c := range inv.calls {
		claimed := c.claim()
		var serr error
		at := now
		if err == nil {
			if at <= 0 {
				at = c.args.win.at
			}
			if count >= 0 {
				if claimed {
					c.out[0] = windowDecision(c.args.win, 0, windowCount(c.args.win, count), at)
				}
			} else {
				r, serr = windowSegment(r, c, at, claimed)
			}
		}
		if !claimed {
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
		c.finish(at, serr)
	}
}

// windowSegment decodes the reply of c's segment at the start of r into
// c.out (only when write: the call is claimed) and returns its error and
// the rest of r.
func windowSegment(r []any, c *scriptCall, now int64, write bool) ([]any, error) {
	if len(r) == 0 {
		return r, fmt.Errorf("%w: short window reply", errReply)
	}
	switch st := r[0].(type) {
	case int64:
		if st == -1 {
			return r[1:], errStaleWindow
		}
		w := c.args.win
		if len(r) < len(w.keys) {
			return nil, fmt.Errorf("%w: window segment", errReply)
		}
		for i := range w.keys {
			if !write {
				break
			}
			v, ok := r[i].(int64)
			if !ok || v < 0 {
				return nil, fmt.Errorf("%w: window hit %T", errReply, r[i])
			}
			c.out[i] = windowDecision(w, i, v, now)
		}
		return r[len(w.keys):], nil
	case string:
		return r[1:], SegmentError(st)
	default:
		return nil, fmt.Errorf("%w: window status %T", errReply, st)
	}
}

// windowDecision is hit i of w decided by code (remaining * 2 +
// allowed) at now (µs).
func windowDecision(w *winArgs, i int, code, now int64) algo.Decision {
	reset := algo.MicrosDuration(w.ws[i] + w.period[i] - now)
	d := algo.Decision{Allowed: code&1 == 1, Remaining: code >> 1, ResetAfter: reset, WindowAfter: reset}
	if !d.Allowed {
		d.RetryAfter = reset
	}
	return d
}

// windowClock is a master's estimate of its clock, which names the
// window of each window key: the server's now read by a checked call
// (TIME) plus the local monotonic time elapsed since its reply. The
// estimate never runs ahead of the server's clock (the server read it
// before the reply arrived, and a wall-clock step of the local host does
// not move a monotonic clock) and lags it by at most the round trip of
// the call it was taken from (accepted only within clockMaxRTT) plus the
// rate difference of the two clocks since; one call per clockRefresh
// checks its windows against TIME and refreshes it. A call with no
// verified estimate (a new master, or after a failed check) checks.
type windowClock struct {
	epoch time.Time    // origin of the local monotonic µs
	off   atomic.Int64 // the server's µs less the local monotonic µs
	known atomic.Bool  // off was taken from a checked reply
	next  atomic.Int64 // local monotonic µs at which a call checks again
}

// clockRefresh is how often a master's window calls check their windows
// against the server's TIME and refresh the estimate of its clock.
const clockRefresh = time.Second

// clockMaxRTT bounds the round trip of a checked call whose server time
// is taken as the estimate, and so how far the estimate may lag the
// server's clock (well under windowTTLSlack).
const clockMaxRTT = 250 * time.Millisecond

// mono is the local monotonic time in µs since k.epoch.
func (k *windowClock) mono() int64 { return int64(time.Since(k.epoch) / time.Microsecond) }

// now is the estimate of the server's now in µs, the local monotonic µs
// it was taken at, and whether the call should check its windows (no
// verified estimate, or clockRefresh since the last check).
func (k *windowClock) now() (est, at int64, check bool) {
	m := k.mono()
	est = m + k.off.Load()
	if !k.known.Load() {
		return est, m, true
	}
	n := k.next.Load()
	return est, m, m >= n && k.next.CompareAndSwap(n, m+clockRefresh.Microseconds())
}

// estimate is the estimate of the server's now in µs (as now, without
// taking a check).
func (k *windowClock) estimate() int64 { return k.mono() + k.off.Load() }

// observe takes server, the server's now read by a checked call sent at
// sent (local monotonic µs), as the estimate when the call's round trip
// was within clockMaxRTT; otherwise the next call checks again.
func (k *windowClock) observe(server, sent int64) {
	m := k.mono()
	if m-sent > clockMaxRTT.Microseconds() {
		k.next.Store(0)
		return
	}
	k.off.Store(server - m)
	k.next.Store(m + clockRefresh.Microseconds())
	k.known.Store(true)
}

// failed makes the next call check: a checked call failed.
func (k *windowClock) failed() { k.next.Store(0) }

// set makes us (µs since the epoch) the estimate of the server's now, not
// yet verified (tests).
func (k *windowClock) set(us int64) {
	k.off.Store(us - k.mono())
	k.known.Store(false)
}
