package redis

import (
	"sync"
	"syscall"
)

// liveness is the set of the Store's TCP sockets to Redis (the sentinels'
// excluded), for one question the batcher asks before it calls Redis
// stalled: has Redis sent bytes that nobody has read yet? If so Redis
// answered, and only ratelimitd itself (its reader goroutines waiting for
// a CPU) is slow: a silence measured by ratelimitd's clock alone cannot
// tell the two apart, and calling a live Redis failed would fail requests
// open on a healthy store. The kernel's count of unread bytes on a socket
// (FIONREAD) does not depend on ratelimitd being scheduled.
type liveness struct {
	skip map[string]bool // addresses not to track (sentinels)
	mu   sync.Mutex
	rcs  []syscall.RawConn
}

// newLiveness tracks every socket but those to the sentinels (when
// sentinel: their pub/sub connections receive messages unasked).
func newLiveness(sentinels []string, sentinel bool) *liveness {
	l := &liveness{skip: map[string]bool{}}
	if sentinel {
		for _, a := range sentinels {
			l.skip[a] = true
		}
	}
	return l
}

// track adds a socket dialed to addr.
func (l *liveness) track(addr string, rc syscall.RawConn) {
	if l.skip[addr] {
		return
	}
	l.mu.Lock()
	l.rcs = append(l.rcs, rc)
	l.mu.Unlock()
}

// unread reports whether some open socket holds bytes not read yet, and
// forgets the sockets that were closed.
func (l *liveness) unread() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	found := false
	kept := l.rcs[:0]
	for _, rc := range l.rcs {
		n, ok := pendingBytes(rc)
		if !ok {
			continue // closed
		}
		kept = append(kept, rc)
		found = found || n > 0
	}
	clear(l.rcs[len(kept):])
	l.rcs = kept
	return found
}
