package memory

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// TestAgainstReference drives stores of 1, 3 and 64 shards, bounded and
// not, with random requests over a small key space (every algorithm,
// short periods, a moving clock, repeated keys, checks, soft hits,
// releases, sweeps) and compares every decision with algotest.Reference.
// A bounded store decides exactly until the first request whose new keys
// do not fit beside the live ones (expired keys always make room); from
// then on (its sketches hold counts the reference does not have), every
// decision is checked against ghost states, the reference's states fed
// with the store's own decisions: no hit the store admits may be one the
// ghost state denies. After every step the shard structures are checked
// (index, heap, key pools, counts).
func TestAgainstReference(t *testing.T) {
	for _, shards := range []int{1, 3, 64} {
		for _, maxKeys := range []int{0, 4, 17} {
			t.Run(fmt.Sprintf("shards=%d/max=%d", shards, maxKeys), func(t *testing.T) {
				for seed := range uint64(4) {
					runReference(t, shards, maxKeys, seed)
				}
			})
		}
	}
}

func runReference(t *testing.T, shards, maxKeys int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(shards*100+maxKeys)))
	nowUs := algotest.Base.UnixMicro()
	s, err := New(Options{Shards: shards, MaxKeys: maxKeys, SweepInterval: -1,
		Now: func() time.Time { return time.UnixMicro(nowUs) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// 40 keys, each with one limit; some keys are long (pooled in large
	// classes, or kept as strings beyond maxPooledKey)
	type keyDef struct {
		key string
		l   algo.Limit
	}
	var defs []keyDef
	for i := range 40 {
		k := fmt.Sprintf("k%d", i)
		switch i % 10 {
		case 7:
			k += strings.Repeat("x", 100+i)
		case 9:
			k += strings.Repeat("y", maxPooledKey+i)
		}
		kind := algo.Kind(i % 5)
		l := algo.Limit{Kind: kind, Rate: int64(1 + rng.IntN(4)), Period: time.Duration(1+rng.IntN(30)) * time.Millisecond}
		if kind == algo.TokenBucket && rng.IntN(2) == 0 {
			l.Burst = l.Rate + 2
		}
		defs = append(defs, keyDef{k, l})
	}
	limitOf := map[string]algo.Limit{}
	for _, d := range defs {
		limitOf[d.key] = d.l
	}
	states := map[string]algo.State{}
	live := func(now int64) int {
		n := 0
		for k, st := range states {
			if algo.ExpiresAtUs(limitOf[k], st) > now {
				n++
			}
		}
		return n
	}

	over := false // a request found the store full: ghost states from then on
	for step := range 1500 {
		nowUs += int64(rng.IntN(8000))
		now := time.UnixMicro(nowUs)
		if rng.IntN(50) == 0 {
			s.Sweep()
			checkShards(t, s)
			if got, want := s.Len(), live(nowUs); !over && got != want {
				t.Fatalf("seed %d step %d: Len after Sweep %d, want %d live", seed, step, got, want)
			}
		}
		hits := make([]algo.Hit, 1+rng.IntN(4))
		for i := range hits {
			d := defs[rng.IntN(len(defs))]
			if i > 0 && rng.IntN(3) == 0 {
				d = keyDef{hits[0].Key, hits[0].Limit} // a repeated key
			}
			hits[i] = algo.Hit{Key: d.key, Limit: d.l, Cost: int64(rng.IntN(4)), Soft: rng.IntN(6) == 0}
			if d.l.Kind == algo.Concurrency && rng.IntN(3) == 0 {
				hits[i].Release = true
			}
		}
		next := maps.Clone(states)
		want := algotest.Reference(next, hits, now)
		// a request that stores new keys beyond the live ones fails when full
		denied := false
		for i, d := range want {
			denied = denied || !d.Allowed && !hits[i].Soft
		}
		full := false
		if maxKeys > 0 && !denied && !over {
			added := 0
			for k := range uniqueKeys(hits) {
				l := limitOf[k]
				if algo.ExpiresAtUs(l, states[k]) <= nowUs && algo.ExpiresAtUs(l, next[k]) > nowUs {
					added++
				}
			}
			full = added > 0 && live(nowUs)+added > maxKeys
		}

		got, err := algotest.Take(context.Background(), s, hits)
		over = over || full
		switch {
		case err != nil:
			t.Fatalf("seed %d step %d: %+v: %v", seed, step, hits, err)
		case over:
			if msg := ghost(states, hits, got, now); msg != "" {
				t.Fatalf("seed %d step %d: %+v: %s", seed, step, hits, msg)
			}
		default:
			for i := range hits {
				if got[i] != want[i] {
					t.Fatalf("seed %d step %d hit %d %+v:\n got  %+v\n want %+v", seed, step, i, hits[i], got[i], want[i])
				}
			}
			states = next
		}
		checkShards(t, s)
		if maxKeys > 0 && s.Len() > maxKeys {
			t.Fatalf("seed %d step %d: Len %d above MaxKeys %d", seed, step, s.Len(), maxKeys)
		}
	}
}

// ghost applies to states (each key's state as the exact algorithms would
// hold it after the decisions the store made) the effect of the store's
// decisions got on hits: every hit of an admitted request, or only the
// kept hits (algo.Hit.Kept) of a denied one. It returns what is wrong
// when the store admitted a hit that the ghost state denies.
func ghost(states map[string]algo.State, hits []algo.Hit, got []algo.Decision, now time.Time) string {
	denied := false
	for i, d := range got {
		denied = denied || !d.Allowed && !hits[i].Soft
	}
	for i, h := range hits {
		if denied && !h.Kept() {
			continue
		}
		ns, d := algo.Apply(states[h.Key], h, now)
		if got[i].Allowed && !d.Allowed {
			return fmt.Sprintf("hit %d admitted, but its exact state %+v denies it", i, states[h.Key])
		}
		if got[i].Allowed || h.Kept() {
			states[h.Key] = ns
		}
	}
	return ""
}

func uniqueKeys(hits []algo.Hit) map[string]bool {
	m := map[string]bool{}
	for _, h := range hits {
		m[h.Key] = true
	}
	return m
}

// checkShards verifies every shard's structures: each index slot names a
// live entry whose key hashes to the slot's hash and is found from its
// home slot; the heap is ordered and its items point back at their
// entries; free lists and counts add up; soonest bounds every top.
func checkShards(t *testing.T, s *Store) {
	t.Helper()
	total := 0
	for si := range s.shards {
		sh := &s.shards[si]
		sh.mu.Lock()
		free := map[uint32]bool{}
		for f := sh.freeE; f != 0; f = sh.ents[f-1].key {
			if free[f-1] {
				t.Fatalf("shard %d: free entry list loops at %d", si, f-1)
			}
			free[f-1] = true
		}
		if got := len(sh.ents) - len(free); got != sh.used || got != len(sh.heap) {
			t.Fatalf("shard %d: %d entries in use, index holds %d, heap %d", si, got, sh.used, len(sh.heap))
		}
		inIndex := 0
		for _, v := range sh.slots {
			if v == 0 {
				continue
			}
			inIndex++
			id := uint32(v) - 1
			if free[id] {
				t.Fatalf("shard %d: index names free entry %d", si, id)
			}
			h := sh.hashOf(id)
			if uint32(v>>32) != uint32(h) || int((h>>32)%uint64(len(s.shards))) != si {
				t.Fatalf("shard %d: entry %d in the wrong slot or shard", si, id)
			}
			if got, ok := sh.find(sh.keyString(id), uint32(h)); !ok || got != id {
				t.Fatalf("shard %d: entry %d not found by its key", si, id)
			}
		}
		if inIndex != sh.used {
			t.Fatalf("shard %d: %d index slots used, used = %d", si, inIndex, sh.used)
		}
		for i, it := range sh.heap {
			if i > 0 && sh.heap[(i-1)/2].exp > it.exp {
				t.Fatalf("shard %d: heap order broken at %d", si, i)
			}
			if free[it.id] || sh.ents[it.id].pos != uint32(i) {
				t.Fatalf("shard %d: heap item %d does not point back at entry %d", si, i, it.id)
			}
		}
		top := int64(math.MaxInt64)
		if len(sh.heap) > 0 {
			top = sh.heap[0].exp
		}
		if sh.top.Load() != top || s.soonest.Load() > top {
			t.Fatalf("shard %d: top %d, published %d, soonest %d", si, top, sh.top.Load(), s.soonest.Load())
		}
		for c := range sh.pools {
			p := &sh.pools[c]
			for f, n := p.free, 0; f != 0; f, n = binaryNext(p, f), n+1 {
				if n > len(p.buf)/max(p.size, 1) {
					t.Fatalf("shard %d: key pool %d free list loops", si, c)
				}
			}
		}
		total += sh.used
		sh.mu.Unlock()
	}
	if s.Len() != total {
		t.Fatalf("Len %d, shards hold %d keys", s.Len(), total)
	}
}

func binaryNext(p *keyPool, f uint32) uint32 {
	off := int(f-1) * p.size
	b := p.buf[off : off+4]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// keyString returns entry id's key (tests).
func (sh *shard) keyString(id uint32) string {
	e := &sh.ents[id]
	if e.klen == longKey {
		return sh.long[id]
	}
	p := &sh.pools[keyClass(int(e.klen))]
	off := int(e.key) * p.size
	return string(p.buf[off : off+int(e.klen)])
}
