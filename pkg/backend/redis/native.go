package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// Native counting: a fixed-window hit under always_charge (algo.Hit.Charge)
// is decided without a script, as envoyproxy/ratelimit counts. Every such
// hit is charged whether admitted or not, so INCRBY's reply (the count
// after the hit) is the whole decision. Its counter lives in its own key
// per window (the hit's key, ":" and the window start in base-36 µs from
// the service's clock). Every hit's PEXPIRE sets the key's TTL to its
// window's end on the sender's clock (plus nativeSkew), as the reference's
// EXPIRE does on every hit: without NX, Redis does not look the key's
// current TTL up, and every version since 2.6 takes the command. A
// release credits the count, floored at 0, with nativeReleaseLua.

// nativeSkew is added to a native key's TTL beyond its window's end, so
// that an instance whose clock is behind the key's creator's by up to
// nativeSkew still finds the window's count.
const nativeSkew = time.Second

// nativeReleaseLua credits ARGV[1] to the count in KEYS[1], floored at 0,
// keeping its TTL, and returns the count after; a missing key (its window
// ended) stays missing and counts 0.
const nativeReleaseLua = `local v = redis.call('GET', KEYS[1])
if not v then return 0 end
v = tonumber(v) - tonumber(ARGV[1])
if v < 0 then v = 0 end
redis.call('SET', KEYS[1], v, 'KEEPTTL')
return v`

var argNativeRelease any = nativeReleaseLua

// nativeHit reports whether h is decided natively (Options.NativeCounting
// on): a fixed-window take or release under always_charge with
// rate < 2^53, without a penalty box (take.lua decides those). A rate of 0 or less is decided in Go with no command (see
// zeroRate).
func nativeHit(h *algo.Hit) bool {
	l := &h.Limit
	return h.Charge && l.Kind == algo.FixedWindow && l.Rate < algo.MaxExact && !h.Penalty.On()
}

// zeroRate is the decision on a fixed window that admits nothing (rate
// <= 0) at now (µs), algo.Take's: denied until the window's end, nothing
// counted, no key touched; a release holds nothing to return.
func zeroRate(h *algo.Hit, nowUS int64) algo.Decision {
	_, we := algo.WindowBoundsUs(h.Limit, nowUS)
	r := time.Duration(we-nowUS) * time.Microsecond
	if h.Release {
		return algo.Decision{Allowed: true, ResetAfter: r, WindowAfter: r}
	}
	return algo.Decision{RetryAfter: r, ResetAfter: r, WindowAfter: r}
}

// nativeKey is the counter key of a native hit in the window starting at
// ws (µs), written in base 36: 10 bytes rather than 16 for today's
// instants, so every command that hashes the key hashes less.
func nativeKey(key string, ws int64) string {
	b := make([]byte, 0, len(key)+12)
	b = append(b, key...)
	b = append(b, ':')
	b = strconv.AppendInt(b, ws, 36)
	return string(b)
}

// nativeCall is the native part of a scriptCall: one hit's counter
// command (INCRBY, or the release script) and its PEXPIRE per hit.
type nativeCall struct {
	keys  []string
	costs []int64
	rel   []bool
	rates []int64
	reset []int64 // µs from now to the window's end
	ttl   []int64 // ms
	incr  []*goredis.Cmd
	exp   []*goredis.BoolCmd
}

// newNativeCall is the native call of hits at now (µs), with slack ms
// added to each key's TTL.
func newNativeCall(hits []algo.Hit, nowUS, slack int64) *nativeCall {
	n := len(hits)
	c := &nativeCall{
		keys: make([]string, n), costs: make([]int64, n), rel: make([]bool, n),
		rates: make([]int64, n), reset: make([]int64, n), ttl: make([]int64, n),
	}
	for i := range hits {
		h := &hits[i]
		ws, we := algo.WindowBoundsUs(h.Limit, nowUS)
		c.keys[i] = nativeKey(h.Key, ws)
		c.costs[i] = algo.ClampCost(h.Cost)
		c.rel[i] = h.Release
		c.rates[i] = h.Limit.Rate
		c.reset[i] = we - nowUS
		c.ttl[i] = (we-nowUS+999)/1000 + nativeSkew.Milliseconds() + slack
	}
	return c
}

// queue appends the call's commands to p: per hit INCRBY (or the release
// script) and PEXPIRE.
func (c *nativeCall) queue(ctx context.Context, p goredis.Pipeliner) {
	c.incr = c.incr[:0]
	c.exp = c.exp[:0]
	for i, k := range c.keys {
		var cmd *goredis.Cmd
		if c.rel[i] {
			cmd = goredis.NewCmd(ctx, argEval, argNativeRelease, 1, k, c.costs[i])
		} else {
			cmd = goredis.NewCmd(ctx, "incrby", k, c.costs[i])
		}
		exp := goredis.NewBoolCmd(ctx, "pexpire", k, c.ttl[i])
		_ = p.Process(ctx, cmd)
		_ = p.Process(ctx, exp)
		c.incr = append(c.incr, cmd)
		c.exp = append(c.exp, exp)
	}
}

// decide writes the call's decisions into out from the replies, or
// returns the first failed command's error.
func (c *nativeCall) decide(out []algo.Decision) error {
	for i := range c.keys {
		if err := c.incr[i].Err(); err != nil {
			return err
		}
		if err := c.exp[i].Err(); err != nil {
			return err
		}
	}
	for i := range c.keys {
		v, err := c.incr[i].Int64()
		if err != nil {
			return err
		}
		out[i] = nativeDecision(c.rates[i], c.costs[i], v, c.rel[i], c.reset[i])
	}
	return nil
}

// nativeDecision is algo.Charge's (or algo.Release's) decision on a fixed
// window of rate whose count is v after the hit of cost, reset µs before
// the window's end.
func nativeDecision(rate, cost, v int64, release bool, reset int64) algo.Decision {
	r := time.Duration(reset) * time.Microsecond
	if release {
		return algo.Decision{Allowed: true, Remaining: max(rate-v, 0), ResetAfter: r, WindowAfter: r}
	}
	rem := max(rate-(v-cost), 0)
	if max(cost, 1) > rem {
		return algo.Decision{RetryAfter: r, ResetAfter: r, WindowAfter: r}
	}
	return algo.Decision{Allowed: true, Remaining: rem - cost, ResetAfter: r, WindowAfter: r}
}

// takeNative decides a request with native hits (see nativeHit) into
// out. The native hits go first, each on its own: on standalone and
// Sentinel as one segment, on Cluster one segment per master of their
// keys, in parallel. The other hits then go to the script as a request
// of their own, decided as denied (modeDenied: only their kept hits
// written) when a native hit that is not Soft denied, as the script
// decides a request that one of its always_charge hits denied.
func (s *Store) takeNative(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	var nat, zero, rest []int
	for i := range hits {
		switch {
		case !nativeHit(&hits[i]):
			rest = append(rest, i)
		case hits[i].Limit.Rate <= 0:
			zero = append(zero, i)
		default:
			nat = append(nat, i)
		}
	}
	denied := false
	if len(zero) > 0 {
		nowUS := s.clock().UnixMicro()
		for _, i := range zero {
			out[i] = zeroRate(&hits[i], nowUS)
			if !out[i].Allowed && !hits[i].Soft {
				denied = true
			}
		}
	}
	nh, nout := pick(hits, nat), make([]algo.Decision, len(nat))
	var err error
	if len(nat) > 0 {
		err = s.runNative(ctx, nh, nout)
	}
	if err != nil {
		var p *causes.Partial
		if !errors.As(err, &p) {
			return err
		}
		// Denied by a native hit while another's master failed: the
		// rest is failed too, the request stays denied.
		for j, i := range nat {
			out[i] = p.Decisions[j]
		}
		failed := slices.Concat(remap(p.Failed, nat), rest)
		slices.Sort(failed)
		return &causes.Partial{Decisions: out, Failed: failed, Err: p.Err}
	}
	for j, i := range nat {
		out[i] = nout[j]
		if !nout[j].Allowed && !hits[i].Soft {
			denied = true
		}
	}
	if len(rest) == 0 {
		return nil
	}
	rh, rout := pick(hits, rest), make([]algo.Decision, len(rest))
	single := !s.cluster && !s.mixed(rh) // one script call decides the rest
	switch {
	case single && denied:
		_, err = s.run(ctx, modeDenied, s.nowUS(), s.nonce(), rh, rout)
	case single:
		_, err = s.run(ctx, modeTake, s.nowUS(), s.nonce(), rh, rout)
	case denied:
		err = s.deniedCluster(ctx, rh, rout)
	default:
		err = s.takeCluster(ctx, rh, rout)
	}
	var p *causes.Partial
	switch {
	case errors.As(err, &p):
		for j, i := range rest {
			out[i] = p.Decisions[j]
		}
		return &causes.Partial{Decisions: out, Failed: remap(p.Failed, rest), Err: p.Err}
	case err != nil && denied:
		// The native hits denied the request whatever the rest says.
		return &causes.Partial{Decisions: out, Failed: rest, Err: err}
	case err != nil:
		return err
	}
	for j, i := range rest {
		out[i] = rout[j]
	}
	return nil
}

// deniedCluster decides hits, the rest of a request that is denied, on a
// Cluster, or with window keys mixed with others (Options.WindowKeys):
// each group of one slot and script in modeDenied (see decideDenied).
func (s *Store) deniedCluster(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	start := s.clk.Now()
	bySlot := map[uint32]*group{}
	var groups []*group
	for i, h := range hits {
		sl := uint32(Slot(h.Key))
		sl |= s.scriptOf(&h) << 16
		g := bySlot[sl]
		if g == nil {
			g = &group{nonce: s.nonce()}
			bySlot[sl] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.hits = append(g.hits, h)
	}
	deadline := s.batch.epoch.Add(time.Duration(s.batch.budget(ctx, int64(start.Sub(s.batch.epoch)))))
	s.decideDenied(ctx, deadline, s.nowUS(), groups)
	var errs []error
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, g.err)
		}
	}
	return collect(groups, out, errs)
}

// runNative decides native hits at the service's clock: one segment on
// standalone and Sentinel; on Cluster one per master of their keys, in
// parallel, each hit deciding on its own. When some masters failed and a
// hit that is not Soft was denied by another, it returns a
// *causes.Partial; when some failed and none denied, their joined errors.
func (s *Store) runNative(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	nowUS := s.clock().UnixMicro()
	var slack int64
	if s.now != nil {
		slack = pinnedSlackMs
	}
	if !s.cluster {
		_, err := s.runOn(ctx, s.def, segment{mode: modeTake, nowUS: nowUS, hits: hits, native: true, slack: slack}, out)
		return err
	}
	byMaster := map[*master]*group{}
	var groups []*group
	for i := range hits {
		ws, _ := algo.WindowBoundsUs(hits[i].Limit, nowUS)
		m := s.masterFor(ctx, nativeKey(hits[i].Key, ws))
		g := byMaster[m]
		if g == nil {
			g = &group{}
			byMaster[m] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.hits = append(g.hits, hits[i])
	}
	ms := make([]*master, len(groups))
	for m, g := range byMaster {
		ms[slices.Index(groups, g)] = m
	}
	var wg sync.WaitGroup
	for k, g := range groups {
		g.out = make([]algo.Decision, len(g.hits))
		wg.Go(func() {
			_, g.err = s.runOn(ctx, ms[k], segment{mode: modeTake, nowUS: nowUS, hits: g.hits, native: true, slack: slack}, g.out)
		})
	}
	wg.Wait()
	var errs []error
	var failed []int
	denied := false
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, g.err)
			failed = append(failed, g.idx...)
			continue
		}
		for j, i := range g.idx {
			out[i] = g.out[j]
			if !g.out[j].Allowed && !hits[i].Soft {
				denied = true
			}
		}
	}
	switch {
	case len(errs) == 0:
		return nil
	case !denied:
		return errors.Join(errs...)
	}
	slices.Sort(failed)
	return &causes.Partial{Decisions: out, Failed: failed, Err: errors.Join(errs...)}
}

// pick is hits[idx...].
func pick(hits []algo.Hit, idx []int) []algo.Hit {
	p := make([]algo.Hit, len(idx))
	for j, i := range idx {
		p[j] = hits[i]
	}
	return p
}

// remap maps indexes into a part of a request (pos[j] is part index j's
// index in the request).
func remap(idx, pos []int) []int {
	r := make([]int, len(idx))
	for j, i := range idx {
		r[j] = pos[i]
	}
	return r
}
