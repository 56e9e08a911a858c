package memory

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Layout of one shard. Every per-key structure is a slice of plain values
// (no pointers, so the garbage collector never scans them) and a key costs,
// at 1,000,000 keys of 22 bytes:
//
//	entry   40 bytes: algo.State's three integers, where the key bytes
//	        are, the key's place in the expiry heap
//	key     its bytes rounded up to 8 (24 for 22), in a pool per length
//	        class; keys longer than maxPooledKey are Go strings in long
//	index   one 8-byte slot of an open-addressing table (linear probing,
//	        at most 3/4 full): 32 bits of the key's hash, entry id + 1
//	heap    one 16-byte item (expiry, entry id) of a binary min-heap
//
// plus the slack of slices grown by append. Sliding-log and concurrency
// timestamps are []int64 in logs, by entry id. Freed entries and key slots
// are reused (free lists threaded through them), so memory stays at the
// peak number of keys, which MaxKeys bounds.

// maxPooledKey is the longest key stored in a key pool; longer keys are
// kept as strings (policy keys are 22 bytes plus the prefix, or their
// clear text, a few hundred bytes).
const maxPooledKey = 1024

// longKey in entry.klen marks a key stored in shard.long.
const longKey = math.MaxUint16

// hasLog in entry.flags: the entry's algo.State.Log is in shard.logs.
const hasLog = 1

// hasPenalty in entry.flags: the entry's penalty box fields (algo.State
// Denials, DenialsEnd, BlockEnd) are in shard.pens.
const hasPenalty = 2

// entry is one stored key. For a free entry, key holds the next free
// entry id + 1 (0: none).
type entry struct {
	time, count, prev int64  // algo.State Time, Count, Prev
	key               uint32 // slot of the key bytes in pools[keyClass(klen)]
	pos               uint32 // index of the key's item in heap
	klen              uint16 // key length in bytes, or longKey
	flags             uint8  // hasLog, hasPenalty
}

// item is the expiry of one key in the heap: exp is algo.ExpiresAtUs of the
// stored state (µs since the epoch, > 0), id the entry.
type item struct {
	exp int64
	id  uint32
}

// keyPool holds keys of one length class in slots of size bytes. A free
// slot's first 4 bytes hold the next free slot + 1.
type keyPool struct {
	buf  []byte
	size int
	free uint32 // first free slot + 1 (0: none)
}

type shard struct {
	mu    sync.Mutex
	st    *Store
	slots []uint64 // index: hash32<<32 | id+1; 0 = empty; len is a power of 2 (or 0)
	used  int      // keys in the index
	ents  []entry
	freeE uint32 // first free entry id + 1 (0: none)
	pools []keyPool
	long  map[uint32]string   // keys longer than maxPooledKey, by entry id
	logs  map[uint32][]int64  // algo.State.Log, by entry id
	pens  map[uint32][3]int64 // algo.State Denials, DenialsEnd, BlockEnd, by entry id
	heap  []item              // min-heap on exp: heap[0] expires first
	// top is heap[0].exp, or math.MaxInt64 when the shard is empty. It is
	// written under mu and read without it (makeRoom).
	top atomic.Int64
	_   [64]byte // keep neighbouring shards' locks off one cache line
}

// keyClass is the pool of a key of n <= maxPooledKey bytes: slots of
// 8*keyClass(n) bytes (at least 8, room for the free-list link).
func keyClass(n int) int { return max(1, (n+7)>>3) }

// find returns the entry id of key (h32: the low 32 bits of its hash).
func (sh *shard) find(key string, h32 uint32) (uint32, bool) {
	if sh.used == 0 {
		return 0, false
	}
	mask := uint32(len(sh.slots) - 1)
	for i := h32 & mask; ; i = (i + 1) & mask {
		sl := sh.slots[i]
		if sl == 0 {
			return 0, false
		}
		if uint32(sl>>32) == h32 {
			if id := uint32(sl) - 1; sh.keyEq(id, key) {
				return id, true
			}
		}
	}
}

func (sh *shard) keyEq(id uint32, key string) bool {
	e := &sh.ents[id]
	if e.klen == longKey {
		return sh.long[id] == key
	}
	if int(e.klen) != len(key) {
		return false
	}
	p := &sh.pools[keyClass(len(key))]
	off := int(e.key) * p.size
	return string(p.buf[off:off+len(key)]) == key
}

// hashOf returns the hash of entry id's key.
func (sh *shard) hashOf(id uint32) uint64 {
	e := &sh.ents[id]
	if e.klen == longKey {
		return maphash.String(sh.st.seed, sh.long[id])
	}
	p := &sh.pools[keyClass(int(e.klen))]
	off := int(e.key) * p.size
	return maphash.Bytes(sh.st.seed, p.buf[off:off+int(e.klen)])
}

// state returns entry id's state. The Log is shared: callers do not modify
// it (pkg/algo never does).
func (sh *shard) state(id uint32) algo.State {
	e := &sh.ents[id]
	st := algo.State{Time: e.time, Count: e.count, Prev: e.prev}
	if e.flags&hasLog != 0 {
		st.Log = sh.logs[id]
	}
	if e.flags&hasPenalty != 0 {
		p := sh.pens[id]
		st.Denials, st.DenialsEnd, st.BlockEnd = p[0], p[1], p[2]
	}
	return st
}

// exp returns entry id's expiry (µs since the epoch).
func (sh *shard) exp(id uint32) int64 { return sh.heap[sh.ents[id].pos].exp }

func (sh *shard) setState(id uint32, st algo.State) {
	e := &sh.ents[id]
	e.time, e.count, e.prev = st.Time, st.Count, st.Prev
	switch {
	case len(st.Log) > 0:
		if sh.logs == nil {
			sh.logs = make(map[uint32][]int64)
		}
		sh.logs[id] = st.Log
		e.flags |= hasLog
	case e.flags&hasLog != 0:
		delete(sh.logs, id)
		e.flags &^= hasLog
	}
	switch {
	case st.Denials != 0 || st.DenialsEnd != 0 || st.BlockEnd != 0:
		if sh.pens == nil {
			sh.pens = make(map[uint32][3]int64)
		}
		sh.pens[id] = [3]int64{st.Denials, st.DenialsEnd, st.BlockEnd}
		e.flags |= hasPenalty
	case e.flags&hasPenalty != 0:
		delete(sh.pens, id)
		e.flags &^= hasPenalty
	}
}

// insert stores a new key (absent from the shard) with state st expiring
// at exp, and returns its entry id.
func (sh *shard) insert(key string, h32 uint32, st algo.State, exp int64) uint32 {
	var id uint32
	if sh.freeE != 0 {
		id = sh.freeE - 1
		sh.freeE = sh.ents[id].key
		sh.ents[id] = entry{}
	} else {
		id = uint32(len(sh.ents))
		sh.ents = append(sh.ents, entry{})
	}
	sh.putKey(id, key)
	sh.setState(id, st)
	if (sh.used+1)*4 > len(sh.slots)*3 {
		sh.grow()
	}
	sh.place(uint64(h32)<<32 | uint64(id+1))
	sh.used++
	sh.ents[id].pos = uint32(len(sh.heap))
	sh.heap = append(sh.heap, item{exp: exp, id: id})
	sh.up(len(sh.heap) - 1)
	sh.fixTop()
	return id
}

// update replaces entry id's state by st expiring at exp.
func (sh *shard) update(id uint32, st algo.State, exp int64) {
	sh.setState(id, st)
	pos := int(sh.ents[id].pos)
	old := sh.heap[pos].exp
	if exp == old {
		return
	}
	sh.heap[pos].exp = exp
	if exp < old {
		sh.up(pos)
	} else {
		sh.down(pos)
	}
	sh.fixTop()
}

// remove drops entry id: index slot, heap item, key bytes, log, entry.
func (sh *shard) remove(id uint32) {
	h32 := uint32(sh.hashOf(id))
	mask := uint32(len(sh.slots) - 1)
	i := h32 & mask
	for uint32(sh.slots[i]) != id+1 {
		i = (i + 1) & mask
	}
	sh.unplace(i)
	sh.used--

	pos := int(sh.ents[id].pos)
	last := len(sh.heap) - 1
	if pos != last {
		sh.heap[pos] = sh.heap[last]
		sh.ents[sh.heap[pos].id].pos = uint32(pos)
	}
	sh.heap = sh.heap[:last]
	if pos < last && !sh.down(pos) {
		sh.up(pos)
	}
	sh.fixTop()

	e := &sh.ents[id]
	if e.klen == longKey {
		delete(sh.long, id)
	} else {
		p := &sh.pools[keyClass(int(e.klen))]
		binary.LittleEndian.PutUint32(p.buf[int(e.key)*p.size:], p.free)
		p.free = e.key + 1
	}
	if e.flags&hasLog != 0 {
		delete(sh.logs, id)
	}
	if e.flags&hasPenalty != 0 {
		delete(sh.pens, id)
	}
	*e = entry{key: sh.freeE}
	sh.freeE = id + 1
}

// expired reports whether the shard's earliest expiry is at or before
// nowUs (a key the eviction may drop).
func (sh *shard) expired(nowUs int64) bool { return len(sh.heap) > 0 && sh.heap[0].exp <= nowUs }

// evictTop drops the key that expires first (the caller checked expired).
func (sh *shard) evictTop() { sh.remove(sh.heap[0].id) }

func (sh *shard) putKey(id uint32, key string) {
	e := &sh.ents[id]
	if len(key) > maxPooledKey {
		if sh.long == nil {
			sh.long = make(map[uint32]string)
		}
		sh.long[id] = strings.Clone(key)
		e.klen = longKey
		return
	}
	c := keyClass(len(key))
	for len(sh.pools) <= c {
		sh.pools = append(sh.pools, keyPool{size: 8 * max(len(sh.pools), 1)})
	}
	p := &sh.pools[c]
	var slot uint32
	if p.free != 0 {
		slot = p.free - 1
		p.free = binary.LittleEndian.Uint32(p.buf[int(slot)*p.size:])
	} else {
		slot = uint32(len(p.buf) / p.size)
		p.buf = append(p.buf, make([]byte, p.size)...)
	}
	copy(p.buf[int(slot)*p.size:], key)
	e.key, e.klen = slot, uint16(len(key))
}

// place puts slot value v at the first empty slot of its probe sequence.
func (sh *shard) place(v uint64) {
	mask := uint32(len(sh.slots) - 1)
	i := uint32(v>>32) & mask
	for sh.slots[i] != 0 {
		i = (i + 1) & mask
	}
	sh.slots[i] = v
}

// unplace empties slot i and shifts the rest of its cluster back so that
// lookups need no tombstones.
func (sh *shard) unplace(i uint32) {
	mask := uint32(len(sh.slots) - 1)
	for j := (i + 1) & mask; sh.slots[j] != 0; j = (j + 1) & mask {
		home := uint32(sh.slots[j]>>32) & mask
		// the slot at j may move to i unless its home lies cyclically in (i, j]
		if (j-home)&mask >= (j-i)&mask {
			sh.slots[i] = sh.slots[j]
			i = j
		}
	}
	sh.slots[i] = 0
}

// grow doubles the index (at least 8 slots) and re-places every key.
func (sh *shard) grow() {
	old := sh.slots
	sh.slots = make([]uint64, max(8, 2*len(old)))
	for _, v := range old {
		if v != 0 {
			sh.place(v)
		}
	}
}

func (sh *shard) up(i int) {
	h := sh.heap
	it := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if h[p].exp <= it.exp {
			break
		}
		h[i] = h[p]
		sh.ents[h[i].id].pos = uint32(i)
		i = p
	}
	h[i] = it
	sh.ents[it.id].pos = uint32(i)
}

// down sifts heap[i] down; it reports whether the item moved.
func (sh *shard) down(i int) bool {
	h := sh.heap
	n := len(h)
	it := h[i]
	i0 := i
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h[r].exp < h[c].exp {
			c = r
		}
		if it.exp <= h[c].exp {
			break
		}
		h[i] = h[c]
		sh.ents[h[i].id].pos = uint32(i)
		i = c
	}
	h[i] = it
	sh.ents[it.id].pos = uint32(i)
	return i != i0
}

// fixTop publishes the earliest expiry after a heap change. When it moved
// earlier, the store's lower bound (Store.soonest) is lowered too.
func (sh *shard) fixTop() {
	t := int64(math.MaxInt64)
	if len(sh.heap) > 0 {
		t = sh.heap[0].exp
	}
	old := sh.top.Load()
	if t == old {
		return
	}
	sh.top.Store(t)
	if t < old {
		sh.st.lowered(t)
	}
}
