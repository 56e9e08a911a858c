package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

var (
	argSHAW    any = windowScript.Hash()
	argScriptW any = windowLua
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

// windowKey is the key of key's counter in the window starting at ws
// (µs): "<key>:<ws>" when key has a hash tag, else "{<key>}:<ws>"; both
// hash to Slot(key).
func windowKey(key string, ws int64) string {
	var b []byte
	if i := strings.IndexByte(key, '{'); i >= 0 && strings.IndexByte(key[i+1:], '}') > 0 {
		b = make([]byte, 0, len(key)+18)
		b = append(b, key...)
	} else {
		b = make([]byte, 0, len(key)+20)
		b = append(b, '{')
		b = append(b, key...)
		b = append(b, '}')
	}
	b = append(b, ':')
	return string(strconv.AppendInt(b, ws, 10))
}

// winArgs is a window segment's script arguments (see segArgs).
type winArgs struct {
	keys []string
	// per hit: rate, period_us, window start, flags, cost
	rate, period, ws, flags, cost []int64
	ttl                           int64 // extra TTL ms (1000 with a pinned clock)
}

// initWindow fills a.win from sg: the keys of the windows containing
// at (sg.nowUS when pinned, else the estimate of the server's now).
func (a *segArgs) initWindow(sg *segment) {
	n := len(sg.hits)
	at := sg.nowUS
	w := &winArgs{}
	if at < 0 {
		at = sg.estUS
	} else {
		w.ttl = 1000
	}
	w.keys = make([]string, n)
	ints := make([]int64, 5*n)
	w.rate, w.period, w.ws, w.flags, w.cost = ints[:n], ints[n:2*n], ints[2*n:3*n], ints[3*n:4*n], ints[4*n:]
	for i := range sg.hits {
		h := &sg.hits[i]
		p := h.Limit.Period.Microseconds()
		ws := at - at%p
		if at < 0 {
			ws = at - (at%p+p)%p
		}
		var f int64
		if h.Release {
			f |= 1
		}
		if h.Soft {
			f |= 2
		}
		if h.Charge {
			f |= 4
		}
		w.keys[i] = windowKey(h.Key, ws)
		w.rate[i], w.period[i], w.ws[i], w.flags[i], w.cost[i] = h.Limit.Rate, p, ws, f, algo.ClampCost(h.Cost)
	}
	a.win = w
	a.keys = w.keys
}

// windowClass is one row of an invocation's class table.
type windowClass struct{ rate, period, ws, ttl int64 }

// argsWindow is one window.lua invocation (EVALSHA or EVAL) deciding
// segs, which are all window segments.
func argsWindow(ctx context.Context, sha bool, segs []*segArgs) *goredis.Cmd {
	nkeys := 0
	for _, sg := range segs {
		nkeys += len(sg.win.keys)
	}
	var classes []windowClass
	codes := make([]int64, 0, nkeys)
	for _, sg := range segs {
		w := sg.win
		for i := range w.keys {
			c := windowClass{w.rate[i], w.period[i], w.ws[i], (w.period[i]+999)/1000 + 1 + w.ttl}
			id := -1
			for j := range classes {
				if classes[j] == c {
					id = j
					break
				}
			}
			if id < 0 {
				id = len(classes)
				classes = append(classes, c)
			}
			codes = append(codes, int64(id)*8+w.flags[i])
		}
	}
	a := make([]any, 0, 6+nkeys+4*len(classes)+2*len(segs)+2*nkeys)
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
	now := argServerNow
	if segs[0].now != argServerNow {
		now = segs[0].now
	}
	a = append(a, now, int64(len(classes)))
	for _, c := range classes {
		a = append(a, c.rate, c.period, c.ws, c.ttl)
	}
	a = append(a, int64(len(segs)))
	k := 0
	for _, sg := range segs {
		a = append(a, sg.mode, int64(len(sg.win.keys)))
		for i := range sg.win.keys {
			a = append(a, &codes[k], &sg.win.cost[i])
			k++
		}
	}
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// deliverWindow completes the calls of a window invocation from its
// reply (see window.lua), or with err: ErrStalled for the calls
// stalledFor reports (see batcher.deliver).
func deliverWindow(inv *invocation, err error, stalledFor func(*scriptCall) bool) {
	var r []any
	if err == nil {
		var ok bool
		if r, ok = inv.cmd.Val().([]any); !ok || len(r) < 1 {
			err = fmt.Errorf("%w: %T", errReply, inv.cmd.Val())
		}
	}
	var now int64
	if err == nil {
		now, _ = r[0].(int64)
		r = r[1:]
	}
	for _, c := range inv.calls {
		claimed := c.claim()
		var serr error
		if err == nil {
			r, serr = windowSegment(r, c, now, claimed)
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
		c.finish(now, serr)
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
		r = r[1:]
		if st == 1 {
			return r, errStaleWindow
		}
		w := c.args.win
		if st != 0 || len(r) < 2*len(w.keys) {
			return nil, fmt.Errorf("%w: window segment", errReply)
		}
		for i := range w.keys {
			if !write {
				break
			}
			al, _ := r[2*i].(int64)
			rem, _ := r[2*i+1].(int64)
			reset := algo.MicrosDuration(w.ws[i] + w.period[i] - now)
			d := algo.Decision{Allowed: al == 1, Remaining: rem, ResetAfter: reset, WindowAfter: reset}
			if !d.Allowed {
				d.RetryAfter = reset
			}
			c.out[i] = d
		}
		return r[2*len(w.keys):], nil
	case string:
		return r[1:], SegmentError(st)
	default:
		return nil, fmt.Errorf("%w: window status %T", errReply, st)
	}
}
