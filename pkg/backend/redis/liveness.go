package redis

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// liveness watches the Store's TCP sockets to Redis (the sentinels'
// excluded) for the question the batcher asks before it calls Redis
// stalled: did Redis send anything? A silence measured by when replies
// were parsed cannot tell a frozen Redis from a ratelimitd whose reader
// goroutines wait for a CPU, and calling a live Redis failed would fail
// requests open on a healthy store. Two facts that do not depend on
// ratelimitd being scheduled answer it: bytes received and not read yet
// (the kernel's FIONREAD count of each socket), and the last time a read
// on any of the sockets returned bytes (lastRead, stamped by the socket
// wrapper itself, before any parsing).
type liveness struct {
	skip  map[string]bool // addresses not to track (sentinels)
	epoch time.Time       // origin of lastRead (the batcher's epoch)
	// lastRead is when a read on a tracked socket last returned bytes, in
	// ns since epoch; 0: never.
	lastRead atomic.Int64
	mu       sync.Mutex
	rcs      []syscall.RawConn
}

// newLiveness tracks every socket but those to the sentinels (when
// sentinel: their pub/sub connections receive messages unasked).
func newLiveness(sentinels []string, sentinel bool) *liveness {
	l := &liveness{skip: map[string]bool{}, epoch: time.Now()}
	if sentinel {
		for _, a := range sentinels {
			l.skip[a] = true
		}
	}
	return l
}

// wrap tracks c, dialed to addr, and returns the connection to use in its
// place: c itself for a sentinel, else a readConn over it.
func (l *liveness) wrap(addr string, c *net.TCPConn) net.Conn {
	if l.skip[addr] {
		return c
	}
	if rc, err := c.SyscallConn(); err == nil {
		l.mu.Lock()
		if len(l.rcs) >= pruneAt {
			l.pruneLocked()
		}
		l.rcs = append(l.rcs, rc)
		l.mu.Unlock()
	}
	return &readConn{TCPConn: c, l: l}
}

// readConn is a *net.TCPConn (every method promoted, SyscallConn included,
// so go-redis' pool health check still sees the socket) whose reads stamp
// liveness.lastRead when they return bytes.
type readConn struct {
	*net.TCPConn
	l *liveness
}

func (c *readConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	if n > 0 {
		c.l.lastRead.Store(int64(time.Since(c.l.epoch)))
	}
	return n, err
}

// readSince reports whether a tracked socket returned bytes to a read at
// or after t (ns since the batcher's epoch, which is given as epoch).
func (l *liveness) readSince(epoch time.Time, t int64) bool {
	last := l.lastRead.Load()
	return last != 0 && l.epoch.Add(time.Duration(last)).Sub(epoch) >= time.Duration(t)
}

// pruneAt is how many sockets wrap keeps before it forgets the closed ones
// (unread also does).
const pruneAt = 256

// unread reports whether some open socket holds bytes not read yet, and
// forgets the sockets that were closed.
func (l *liveness) unread() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pruneLocked()
}

// pruneLocked forgets the closed sockets and reports whether an open one
// holds bytes not read yet. l.mu is held.
func (l *liveness) pruneLocked() bool {
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
