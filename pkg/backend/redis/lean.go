package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// leanLua decides sliding_window and token_bucket hits on lean keys
// (Options.WindowKeys): plain integer values read with one MGET per
// call, INCRBY (sliding window) or SET (token bucket) when a request is
// allowed, one class table per call, an integer-array reply from which
// the Store computes the decisions with pkg/algo (see lean.lua).
//
//go:embed lean.lua
var leanLua string

// leanScript is leanLua's handle.
var leanScript = goredis.NewScript(leanLua)

// LeanScriptSHA is the SHA1 of the embedded lean-key script, which Warm
// loads next to the others.
func LeanScriptSHA() string { return leanScript.Hash() }

var (
	argSHAL     any = leanScript.Hash()
	argScriptL  any = leanLua
	argKindSW   any = "s"
	argKindGCRA any = "g"
)

// Key elements of the lean layout: they keep its keys apart from the
// keys of the other layouts (take.lua's value layout on the key itself,
// window.lua's "<key>:<window_start>") and from each other's.
const (
	leanSlidingTag = ":v2s:"
	leanBucketTag  = ":v2g"
)

// leanKind reports whether h is decided by lean.lua when
// Options.WindowKeys is on: a sliding_window limit without a calendar or
// a token_bucket limit without a penalty box, 1 <= rate < 2^53,
// 1 <= period < 2^53 µs, on a key
// that can carry a suffix in the same hash slot (windowKeyable). The
// answer depends on the limit and the key only, so every request counts a
// given limit the same way.
func leanKind(h *algo.Hit) bool {
	l := &h.Limit
	p := l.Period.Microseconds()
	return (l.Kind == algo.SlidingWindow && l.Calendar == algo.CalendarNone || l.Kind == algo.TokenBucket) &&
		!h.Penalty.On() && // lean.lua has no penalty box: take.lua decides it
		l.Rate >= 1 && l.Rate < algo.MaxExact && p >= 1 && p < algo.MaxExact &&
		windowKeyable(h.Key)
}

// Scripts a hit is decided by (scriptOf).
const (
	scriptTake   = 0 // take.lua or take1.lua
	scriptWindow = 1 // window.lua
	scriptLean   = 2 // lean.lua
)

// scriptOf is the script that decides h: with Options.WindowKeys,
// window.lua for windowKind and lean.lua for leanKind hits; take.lua
// otherwise. Hits of different scripts in one request are decided
// all-or-nothing as a Cluster request's slot groups are (takeCluster).
func (s *Store) scriptOf(h *algo.Hit) uint32 {
	switch {
	case !s.windowKeys:
		return scriptTake
	case windowKind(h):
		return scriptWindow
	case leanKind(h):
		return scriptLean
	}
	return scriptTake
}

// script is the script c's segment goes to (see scriptOf).
func (c *scriptCall) script() int {
	switch {
	case c.args.lean != nil:
		return scriptLean
	case c.window:
		return scriptWindow
	}
	return scriptTake
}

// leanKey is the lean key of key: "<key><tag>" (and the window start
// when ws is set) when key has a hash tag, else "{<key>}<tag>…"; both
// hash to Slot(key).
func leanKey(key, tag string, ws int64, window bool) string {
	b := make([]byte, 0, len(key)+len(tag)+22)
	if i := strings.IndexByte(key, '{'); i >= 0 && strings.IndexByte(key[i+1:], '}') > 0 {
		b = append(b, key...)
	} else {
		b = append(b, '{')
		b = append(b, key...)
		b = append(b, '}')
	}
	b = append(b, tag...)
	if window {
		b = strconv.AppendInt(b, ws, 10)
	}
	return string(b)
}

// leanKeys is the lean keys of h at at (µs) in the order lean.lua reads
// them: a sliding window's current and previous window key, a token
// bucket's key.
func leanKeys(h *algo.Hit, at int64) []string {
	if h.Limit.Kind == algo.TokenBucket {
		return []string{leanKey(h.Key, leanBucketTag, 0, false)}
	}
	ws := windowStart(at, h.Limit.Period.Microseconds())
	return []string{leanKey(h.Key, leanSlidingTag, ws, true), leanKey(h.Key, leanSlidingTag, ws-h.Limit.Period.Microseconds(), true)}
}

// windowStart is the start of the epoch-aligned window of length p
// containing at (floored for negative instants too).
func windowStart(at, p int64) int64 { return at - (at%p+p)%p }

// leanArgs is a lean segment's script arguments (see segArgs).
type leanArgs struct {
	mode  string
	hits  []algo.Hit // copies of the segment's hits
	ws    []int64    // per hit its window start (sliding_window)
	keys  []string   // KEYS: per hit leanKeys
	slack int64      // extra TTL ms (pinnedSlackMs with a pinned clock)
}

// pinnedSlackMs is added to a key's TTL when Options.Now pins the clock
// (tests): Redis expires keys by real time, which a pinned clock does not
// follow, so the TTL must outlast any real time a test spends between
// steps, however starved the host. take.lua's ttl_ms, take1.lua,
// window.lua, window1.lua (and its Function), native counting and
// lease.lua add the same. The TTL is the only real time a pinned Store
// uses for its keys (the scripts read no TIME then), and with the slack
// it changes no answer: a key whose state matters at the pinned now
// outlives the test, and a key that outlives its state changes nothing
// either, since window and lean keys are named by their window and
// take.lua's values carry their instant, as pkg/algo's states do.
const pinnedSlackMs = 3_600_000

// initLean fills a.lean from sg: the keys of the windows containing at
// (sg.nowUS when pinned, else the estimate of the server's now).
func (a *segArgs) initLean(sg *segment) {
	at := sg.nowUS
	w := &leanArgs{mode: sg.mode, hits: append([]algo.Hit(nil), sg.hits...), ws: make([]int64, len(sg.hits))}
	if at < 0 {
		at = sg.estUS
	} else {
		w.slack = pinnedSlackMs
	}
	w.keys = make([]string, 0, 2*len(sg.hits))
	for i := range w.hits {
		h := &w.hits[i]
		h.Cost = algo.ClampCost(h.Cost)
		if h.Limit.Kind == algo.SlidingWindow {
			w.ws[i] = windowStart(at, h.Limit.Period.Microseconds())
		}
		w.keys = append(w.keys, leanKeys(h, at)...)
	}
	a.lean = w
	a.keys = w.keys
}

// leanClass is one row of an invocation's class table.
type leanClass struct {
	kind                 any // argKindSW or argKindGCRA
	rate, period, x, ttl int64
}

// classOf is the class of hit i: for a sliding window its window start
// and a TTL of two periods; for a token bucket its capacity and a TTL of
// two capacities of time (the farthest ahead of now a TAT gets, in the
// debt of always_charge), in ms rounded up plus 1 (Redis adds PX to its
// command-start time in whole ms).
func (w *leanArgs) classOf(i int) leanClass {
	l := &w.hits[i].Limit
	p := l.Period.Microseconds()
	if l.Kind == algo.SlidingWindow {
		return leanClass{argKindSW, l.Rate, p, w.ws[i], (2*p+999)/1000 + 1 + w.slack}
	}
	b := l.Burst
	if b <= 0 {
		b = l.Rate
	}
	q, m := p/l.Rate, p%l.Rate
	tau := b*q + (b*m+l.Rate-1)/l.Rate // µs, rounded up
	return leanClass{argKindGCRA, l.Rate, p, b, (2*tau+999)/1000 + 1 + w.slack}
}

// argsLean is one lean.lua invocation (EVALSHA or EVAL) deciding segs,
// which are all lean segments.
func argsLean(ctx context.Context, sha bool, segs []*segArgs) *goredis.Cmd {
	nkeys, nhits := 0, 0
	for _, sg := range segs {
		nkeys += len(sg.lean.keys)
		nhits += len(sg.lean.hits)
	}
	var classes []leanClass
	codes := make([]int64, 0, nhits)
	for _, sg := range segs {
		w := sg.lean
		for i := range w.hits {
			c := w.classOf(i)
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
			var f int64
			h := &w.hits[i]
			if h.Release {
				f |= 1
			}
			if h.Soft {
				f |= 2
			}
			if h.Charge {
				f |= 4
			}
			codes = append(codes, int64(id)*8+f)
		}
	}
	a := make([]any, 0, 6+nkeys+5*len(classes)+2*len(segs)+2*nhits)
	if sha {
		a = append(a, argEvalSHA, argSHAL)
	} else {
		a = append(a, argEval, argScriptL)
	}
	a = append(a, int64(nkeys))
	for _, sg := range segs {
		for i := range sg.lean.keys {
			a = append(a, &sg.lean.keys[i])
		}
	}
	a = append(a, segs[0].now, int64(len(classes)))
	for _, c := range classes {
		a = append(a, c.kind, c.rate, c.period, c.x, c.ttl)
	}
	if leanUniform(segs, codes) {
		return leanCmd(ctx, append(a, argUniform, int64(len(segs)), &codes[0], &segs[0].lean.hits[0].Cost))
	}
	a = append(a, int64(len(segs)))
	k := 0
	for _, sg := range segs {
		a = append(a, leanHeader(sg.lean.mode, len(sg.lean.hits)))
		for i := range sg.lean.hits {
			a = append(a, &codes[k], &sg.lean.hits[i].Cost)
			k++
		}
	}
	return leanCmd(ctx, a)
}

func leanCmd(ctx context.Context, a []any) *goredis.Cmd {
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// argUniform marks the arguments of a call whose segments are all a take
// of one hit of one code and cost: they are sent once (see lean.lua).
var argUniform any = "="

// leanUniform reports whether segs, with codes the codes of their hits,
// are several takes of one hit of one code and cost, without a release
// or a charge (lean.lua decides those inline). One segment is shorter in
// the usual form.
func leanUniform(segs []*segArgs, codes []int64) bool {
	if len(segs) < 2 || codes[0]&5 != 0 {
		return false
	}
	cost := segs[0].lean.hits[0].Cost
	for i, sg := range segs {
		if sg.lean.mode != modeTake || len(sg.lean.hits) != 1 || codes[i] != codes[0] || sg.lean.hits[0].Cost != cost {
			return false
		}
	}
	return true
}

// argT1 is the header of the usual segment: a take of one hit.
var argT1 any = modeTake + "1"

// leanHeader is a segment's header argument: its mode and number of hits.
func leanHeader(mode string, n int) any {
	if mode == modeTake && n == 1 {
		return argT1
	}
	return mode + strconv.Itoa(n)
}

// deliverLean completes the calls of a lean invocation from its reply
// (see lean.lua), or with err: ErrStalled for the calls stalledFor
// reports (see batcher.deliver).
func deliverLean(inv *invocation, err error, stalledFor func(*scriptCall) bool) {
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
			r, serr = leanSegment(r, c, now, claimed)
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

// leanSegment decodes the reply of c's segment at the start of r into
// c.out (only when write: the call is claimed) and returns its error and
// the rest of r.
func leanSegment(r []any, c *scriptCall, now int64, write bool) ([]any, error) {
	if len(r) == 0 {
		return r, fmt.Errorf("%w: short lean reply", errReply)
	}
	switch st := r[0].(type) {
	case int64:
		r = r[1:]
		if st == 1 {
			return r, errStaleWindow
		}
		w := c.args.lean
		n := len(w.hits)
		if st != 0 || len(r) < 1+2*n {
			return nil, fmt.Errorf("%w: lean segment", errReply)
		}
		denied, _ := r[0].(int64)
		pre := make([]int64, 2*n)
		for i := range pre {
			v, ok := r[1+i].(int64)
			if !ok {
				return nil, fmt.Errorf("%w: lean value %T", errReply, r[1+i])
			}
			pre[i] = v
		}
		r = r[1+2*n:]
		if !write {
			return r, nil
		}
		if got := w.decide(now, pre, c.out); got != (denied == 1) {
			return r, fmt.Errorf("%w: lean.lua and pkg/algo disagree on the request (script denied: %v)", errReply, denied == 1)
		}
		return r, nil
	case string:
		return r[1:], SegmentError(st)
	default:
		return nil, fmt.Errorf("%w: lean status %T", errReply, st)
	}
}

// decide computes the decisions of w's hits at now (µs) into out with
// pkg/algo, from pre, the two integers per hit of its key's state before
// the request as lean.lua read it, exactly as algotest.Reference
// decides a request (mode t and d; d: as a take that denied) or as
// take.lua reverses a take (mode r: the checks on the restored state).
// It reports whether the request denied.
func (w *leanArgs) decide(now int64, pre []int64, out []algo.Decision) bool {
	t := time.UnixMicro(now)
	n := len(w.hits)
	var buf [4]algo.State
	tent := buf[:0]
	if n > len(buf) {
		tent = make([]algo.State, 0, n)
	}
	tent = tent[:n]
	// initial is the state of hit i's key before the request.
	initial := func(i int) algo.State {
		if w.hits[i].Limit.Kind == algo.SlidingWindow {
			return algo.State{Time: w.ws[i], Count: pre[2*i], Prev: pre[2*i+1]}
		}
		return algo.State{Time: pre[2*i], Count: pre[2*i+1]}
	}
	var sbuf [4]bool
	set := sbuf[:0]
	if n > len(sbuf) {
		set = make([]bool, 0, n)
	}
	set = set[:n]
	// state is the tentative state of hit i's key: that of its latest hit
	// before i that set tent, or the state before the request.
	state := func(i int) algo.State {
		for j := i - 1; j >= 0; j-- {
			if set[j] && w.hits[j].Key == w.hits[i].Key {
				return tent[j]
			}
		}
		return initial(i)
	}
	if w.mode == modeRefund {
		// in reverse order; then each hit reports a check on its key's
		// restored state (that of the key's first hit)
		first := func(i int) int {
			for j := 0; j < i; j++ {
				if w.hits[j].Key == w.hits[i].Key {
					return j
				}
			}
			return i
		}
		for i := n - 1; i >= 0; i-- {
			h := &w.hits[i]
			st := initial(i)
			for j := i + 1; j < n; j++ {
				if w.hits[j].Key == h.Key {
					st = tent[j]
					break
				}
			}
			if h.Cost > 0 && !h.Release {
				st = leanRefund(&h.Limit, st, h.Cost)
			}
			tent[i] = st
		}
		for i := range w.hits {
			_, out[i] = algo.Take(w.hits[i].Limit, tent[first(i)], t, 0)
		}
		return false
	}
	denied := w.mode == modeDenied
	for i := range w.hits {
		h := &w.hits[i]
		tent[i], out[i] = algo.Apply(state(i), *h, t)
		set[i] = true
		denied = denied || !out[i].Allowed && !h.Soft
	}
	if !denied {
		return false
	}
	clear(set)
	for i := range w.hits {
		h := &w.hits[i]
		st := state(i)
		switch {
		case h.Kept():
			tent[i], out[i] = algo.Apply(st, *h, t)
			set[i] = true
		case out[i].Allowed:
			_, out[i] = algo.Take(h.Limit, st, t, 0)
		}
	}
	return true
}

// leanRefund reverses a take of cost on st (lean.lua mode r): a sliding
// window's count of the take's window less cost, floored at 0; a token
// bucket's TAT moved back by cost × T exactly (pkg/algo/take.go's
// emission interval T = Period/Rate).
func leanRefund(l *algo.Limit, st algo.State, cost int64) algo.State {
	if l.Kind == algo.SlidingWindow {
		st.Count = max(st.Count-cost, 0)
		return st
	}
	if st.Time == 0 && st.Count == 0 {
		return st
	}
	r, p := l.Rate, l.Period.Microseconds()
	q, m := p/r, p%r
	n := st.Count - cost*m
	d := n / r
	if n%r < 0 {
		d--
	}
	return algo.State{Time: st.Time - cost*q + d, Count: n - d*r}
}
