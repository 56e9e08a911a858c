package redis

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

// mixed reports whether hits mix window keys with other hits
// (Options.WindowKeys): they go to two scripts, decided all-or-nothing as
// a Cluster request's slot groups are (takeCluster).
func (s *Store) mixed(hits []algo.Hit) bool {
	if !s.windowKeys {
		return false
	}
	w := s.scriptOf(&hits[0])
	for i := 1; i < len(hits); i++ {
		if s.scriptOf(&hits[i]) != w {
			return true
		}
	}
	return false
}

// group is the hits of one hash slot within a request.
type group struct {
	idx   []int // positions in the request
	hits  []algo.Hit
	out   []algo.Decision
	nowUS int64
	nonce string
	err   error
}

// denied reports whether the group denied the request: a hit that is not
// Soft was denied (the script then wrote nothing).
func (g *group) denied() bool {
	for i, d := range g.out {
		if !d.Allowed && !g.hits[i].Soft {
			return true
		}
	}
	return false
}

// takeCluster decides hits on a Cluster: one script call per hash slot
// group, all-or-nothing across groups. The group most likely to deny
// (leadScore) goes first, alone: when it denies, the others are decided as
// denied (modeDenied), so they consume nothing; when it allows, the others
// are taken in parallel, and when one denies or fails, compensating
// refunds reverse what the allowed groups consumed. When some groups
// failed and another denied, the request is denied regardless and the
// error is a *causes.Partial; when some failed and none denied, it is
// their joined errors.
func (s *Store) takeCluster(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	start := s.clk.Now()
	bySlot := make(map[uint32]*group, 2)
	var groups []*group
	for i, h := range hits {
		sl := uint32(Slot(h.Key))
		sl |= s.scriptOf(&h) << 16
		g := bySlot[sl]
		if g == nil {
			g = &group{}
			bySlot[sl] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.hits = append(g.hits, h)
	}
	nonce := s.nonce()
	nowUS := s.nowUS()
	if len(groups) == 1 {
		_, err := s.run(ctx, modeTake, nowUS, nonce, hits, out)
		if err == nil {
			s.hints.note(hits, out, s.clock())
		}
		return err
	}
	now := s.clock()
	lead, best := 0, int64(0)
	for i, g := range groups {
		g.out = make([]algo.Decision, len(g.hits))
		g.nonce = nonce
		if sc := s.hints.leadScore(g.hits, now); i == 0 || sc < best {
			lead, best = i, sc
		}
	}
	groups[0], groups[lead] = groups[lead], groups[0]
	first, rest := groups[0], groups[1:]
	first.nowUS, first.err = s.run(ctx, modeTake, nowUS, nonce, first.hits, first.out)
	deadline := s.batch.epoch.Add(time.Duration(s.batch.budget(ctx, int64(start.Sub(s.batch.epoch)))))
	firstDenied := first.err == nil && first.denied()
	if firstDenied {
		s.decideDenied(ctx, deadline, nowUS, rest)
	} else {
		var wg sync.WaitGroup
		for _, g := range rest {
			wg.Go(func() {
				g.nowUS, g.err = s.run(ctx, modeTake, nowUS, nonce, g.hits, g.out)
			})
		}
		wg.Wait()
	}
	var errs []error
	denied := false
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, g.err)
			continue
		}
		s.hints.note(g.hits, g.out, now)
		if g.denied() {
			denied = true
		}
	}
	if !firstDenied && (denied || len(errs) > 0) {
		// A denial decides the request whatever the failed groups would
		// have said, so then the refunds' decisions are waited for as
		// for any denial; a failure without a denial uses none.
		s.compensate(ctx, deadline, groups, !denied)
	}
	if len(errs) > 0 && !denied {
		return errors.Join(errs...)
	}
	return collect(groups, out, errs)
}

// collect copies the decided groups' decisions into out. When errs is not
// empty (a group failed while a live master denied), it returns a
// causes.Partial: the decided hits are answered, the failed ones get their
// failure modes (service.PartialFailure), and the request stays denied.
func collect(groups []*group, out []algo.Decision, errs []error) error {
	var failed []int
	for _, g := range groups {
		if g.err != nil {
			failed = append(failed, g.idx...)
			continue
		}
		for j, i := range g.idx {
			out[i] = g.out[j]
		}
	}
	if len(errs) > 0 {
		slices.Sort(failed)
		return &causes.Partial{Decisions: out, Failed: failed, Err: errors.Join(errs...)}
	}
	return nil
}

// decideDenied decides groups, the rest of a request another group
// denied, in modeDenied: each writes only its kept hits and reports the
// others as a denied request does. They run in the background under their
// own Timeout, so kept hits are written even when the caller has gone
// (Close waits for them); decideDenied waits until deadline or ctx's end,
// and a group not decided by then gets ErrDeadline (or its own error).
func (s *Store) decideDenied(ctx context.Context, deadline time.Time, nowUS int64, groups []*group) {
	type decided struct {
		g     *group
		out   []algo.Decision
		nowUS int64
		err   error
	}
	done := make(chan decided, len(groups))
	for _, g := range groups {
		hits := g.hits
		s.bg.Go(func() {
			out := make([]algo.Decision, len(hits))
			n, err := s.run(context.WithoutCancel(ctx), modeDenied, nowUS, g.nonce, hits, out)
			done <- decided{g, out, n, err}
		})
	}
	for _, g := range groups {
		g.err = ErrDeadline
	}
	wait := time.NewTimer(deadline.Sub(s.clk.Now()))
	defer wait.Stop()
	for range groups {
		select {
		case d := <-done:
			d.g.out, d.g.nowUS, d.g.err = d.out, d.nowUS, d.err
		case <-wait.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// compensate reverses every group of a denied or failed request that
// consumed, so that the request consumes nothing. Each refund runs in the
// background under its own Timeout (Close waits for it). For a denied
// request compensate waits until deadline or ctx's end, and each refund's
// reply (a check on the restored state) replaces its group's decisions;
// for a failed one it does not wait.
func (s *Store) compensate(ctx context.Context, deadline time.Time, groups []*group, failed bool) {
	type refunded struct {
		g      *group
		checks []algo.Decision
	}
	done := make(chan refunded, len(groups))
	n := 0
	for _, g := range groups {
		if g.err != nil || g.denied() {
			continue
		}
		n++
		// Reverse only what the take consumed and the request does not
		// keep: a hit denied on its own (Soft) wrote nothing, and
		// releases and always_charge hits stay (algo.Hit.Kept).
		rh := make([]algo.Hit, len(g.hits))
		for j, h := range g.hits {
			if !g.out[j].Allowed || h.Kept() {
				h.Cost = 0
			}
			h.Release, h.Charge = false, false
			rh[j] = h
		}
		s.bg.Go(func() {
			checks := make([]algo.Decision, len(rh))
			if _, err := s.run(context.WithoutCancel(ctx), modeRefund, g.nowUS, g.nonce, rh, checks); err != nil {
				s.refundErrors.Add(1)
				checks = nil
			}
			s.publishCredits(rh, func(h algo.Hit) bool { return h.Cost > 0 })
			done <- refunded{g, checks}
		})
	}
	if failed || n == 0 {
		return
	}
	wait := time.NewTimer(deadline.Sub(s.clk.Now()))
	defer wait.Stop()
	for range n {
		select {
		case r := <-done:
			if r.checks == nil {
				continue
			}
			// Hits that did not deny report the value before the request;
			// a hit denied on its own (a check, or a second hit on a key)
			// and a kept hit keep their decision.
			for j, d := range r.g.out {
				if d.Allowed && !r.g.hits[j].Kept() {
					r.g.out[j] = r.checks[j]
				}
			}
		case <-wait.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag (the bytes between the first '{' and the next '}',
// when non-empty), modulo 16384. Source: Redis Cluster specification,
// "Keys distribution model".
func Slot(key string) uint16 {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) & 16383
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}
