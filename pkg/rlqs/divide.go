// Dividing each counter's remaining budget among the streams.

package rlqs

import (
	"maps"
	"slices"
	"strings"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/fairshare"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// keyIn is one counter's input to a round.
type keyIn struct {
	spec    *policy.Spec
	penalty bool // the rule has a penalty box
	usage   int64
	local   map[string]int64   // subscriber -> demand, milli-units per window
	refs    map[string]*bucket // subscriber -> bucket
}

// gather collects every counter's usage (taken from the buckets) and local
// demand.
func (s *Server) gather(set *policy.Set) map[string]*keyIn {
	ins := s.gatherKeys(set, nil)
	for _, in := range ins {
		for _, b := range in.refs {
			in.usage += b.usage
		}
	}
	for st := range s.streams {
		for _, b := range st.buckets {
			if len(b.keys) > 0 {
				b.usage = 0
			}
		}
	}
	return ins
}

// gatherKeys collects the local demand of the counters in only (all when
// nil).
func (s *Server) gatherKeys(set *policy.Set, only map[string]bool) map[string]*keyIn {
	ins := map[string]*keyIn{}
	if set == nil {
		return ins
	}
	for st := range s.streams {
		for _, b := range st.buckets {
			for i, k := range b.keys {
				if only != nil && !only[k] {
					continue
				}
				in := ins[k]
				if in == nil {
					in = &keyIn{spec: b.specs[i], penalty: b.penalty, local: map[string]int64{}, refs: map[string]*bucket{}}
					ins[k] = in
				}
				in.local[b.sub] = s.demandOf(b, b.specs[i])
				in.refs[b.sub] = b
			}
		}
	}
	return ins
}

// unknown is the demand of a bucket that has not reported a whole second
// yet.
const unknown = -1

// demandOf is a bucket's demand on a limit in milli-units per window, or
// unknown; a silent bucket has none.
func (s *Server) demandOf(b *bucket, sp *policy.Spec) int64 {
	if s.silent(b) {
		return 0
	}
	if b.rate < 0 {
		return unknown
	}
	return int64(b.rate * window(sp).Seconds() * milli)
}

// floorOf is what a stream whose demand is not known yet gets of a limit: a
// tenth of it, in milli-units per window.
func floorOf(sp *policy.Spec) int64 { return max(int64(sp.RequestsPerUnit)*milli/10, 1) }

// divide divides budget among fleet (subscriber -> demand or unknown). The
// streams of unknown demand get floor each first, at most an even share,
// so that a new stream can start before it has a whole second to report;
// the rest is divided max-min fairly by demand. A join leaves the demand
// history to the rounds, so that every replica's allocator sees the same
// rounds.
func (s *Server) divide(ks *keyState, now time.Time, budget int64, fleet map[string]int64, floor int64, join bool) map[string]int64 {
	known := make(map[string]int64, len(fleet))
	var fresh []string
	for id, d := range fleet {
		if d == unknown {
			fresh = append(fresh, id)
		} else {
			known[id] = d
		}
	}
	out := map[string]int64{}
	if n := int64(len(fresh)); n > 0 {
		each := min(floor, budget/int64(len(fleet)))
		for _, id := range fresh {
			out[id] = each
		}
		budget -= each * n
	}
	a := ks.alloc
	if join {
		a = fairshare.New(fairshare.Options{})
	}
	for id, g := range a.Allocate(now, budget, known) {
		out[id] = g
	}
	return out
}

// divideAll divides the counters of ins among the fleet's streams: per
// counter key, the share of each local bucket on it. A round divides with
// each counter's allocator, which keeps the demand history; a join (a new
// bucket between rounds) divides the demand as it is, leaving the history
// to the rounds, so that every replica's allocator sees the same rounds.
func (s *Server) divideAll(now time.Time, ins map[string]*keyIn, join bool) map[string]map[*bucket]share {
	per := make(map[string]map[*bucket]share, len(ins))
	for k, in := range ins {
		ks := s.keyState(k, in.spec)
		ks.penalty = in.penalty
		// The fleet's demand as every replica sees it this round; this
		// replica's streams that left are dropped, and those not shared yet
		// are added with their demand as it is.
		fleet := map[string]int64{}
		mine := s.opt.Replica + "-"
		for id, d := range ks.remote {
			if _, ok := in.local[id]; ok || !strings.HasPrefix(id, mine) {
				fleet[id] = d
			}
		}
		for id, d := range in.local {
			if _, ok := fleet[id]; !ok {
				fleet[id] = d
			}
		}
		sp := in.spec
		windowed := window(sp) > s.TTL() && ks.known
		p := planFor(sp, demanding(fleet), s.opt.Headroom, ks.remaining, windowed, s.opt.Interval)
		deny := p.spent || (ks.failed && sp.FailureMode == policy.FailClosed)
		var alloc map[string]int64
		if !deny {
			floor := floorOf(sp)
			if windowed {
				// A budget's rate is what may be used over two intervals:
				// a stream of unknown demand gets an even share of it.
				floor = p.budget
			}
			alloc = s.divide(ks, now, p.budget, fleet, floor, join)
		}
		m := make(map[*bucket]share, len(in.refs))
		for sub, b := range in.refs {
			sh := share{deny: deny, maxTokens: p.burst, rate: alloc[sub], window: window(sp)}
			if fleet[sub] == 0 {
				sh.maxTokens = idleTokens
			}
			m[b] = sh
		}
		per[k] = m
	}
	return per
}

// sendShares queues the assignment of every bucket in per, the stricter
// of its shares on several counters, and of extra.
func (s *Server) sendShares(per map[string]map[*bucket]share, extra []*bucket) {
	shares := combined(per)
	// Each stream's actions are queued at once, so that its sender sends
	// them as one response rather than as many as it happens to wake for.
	out := map[*stream]map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}
	send := func(b *bucket) {
		var st *typev3.RateLimitStrategy
		switch sh, ok := shares[b]; {
		case b.kind != kindLimited || !ok:
			st = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
		default:
			st = strategy(sh)
		}
		b.sent = st
		s.m.count(st)
		if out[b.st] == nil {
			out[b.st] = map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}
		}
		out[b.st][b.canon] = assignment(b.id, st, s.TTL())
	}
	for b := range shares {
		send(b)
	}
	for _, b := range extra {
		if _, ok := shares[b]; !ok {
			send(b)
		}
	}
	for st, actions := range out {
		st.queueAll(actions)
	}
}

// combined is each bucket's share on all its counters of per: the
// stricter of them (combine).
func combined(per map[string]map[*bucket]share) map[*bucket]share {
	shares := map[*bucket]share{}
	for _, k := range slices.Sorted(maps.Keys(per)) {
		for b, sh := range per[k] {
			old, ok := shares[b]
			shares[b] = combine(old, sh, !ok)
		}
	}
	return shares
}
