package redis

import (
	"context"
	"sync"
	"sync/atomic"
)

// masterWatch notices a Sentinel failover from the Store's side: go-redis
// dials only the sentinels and the master it resolved through them, so a
// new dialed address that is not a sentinel means the master changed. Each
// change is counted (Store.MasterChanges) and logged, since hits not yet
// replicated at the promotion are lost unless the servers run with
// min-replicas-to-write (see docs/redis-operations.md).
type masterWatch struct {
	sentinels map[string]bool
	mu        sync.Mutex
	last      string
	changes   atomic.Uint64
}

func newMasterWatch(sentinels []string) *masterWatch {
	w := &masterWatch{sentinels: map[string]bool{}}
	for _, a := range sentinels {
		w.sentinels[a] = true
	}
	return w
}

// dialed is told every address dialed successfully.
func (w *masterWatch) dialed(addr string) {
	if w.sentinels[addr] {
		return
	}
	w.mu.Lock()
	prev := w.last
	w.last = addr
	w.mu.Unlock()
	if prev == "" || prev == addr {
		return
	}
	w.changes.Add(1)
	if l := logger.Load(); l != nil {
		(*l).Printf(context.Background(), "redis: Sentinel master changed from %s to %s (failover): hits the old master decided after the promotion, or had not replicated, are lost unless the servers run min-replicas-to-write", prev, addr)
	}
}
