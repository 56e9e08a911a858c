package redis

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// liveness watches the Store's TCP sockets to Redis (the sentinels'
// excluded) to answer, for the batcher, whether Redis is stalled: has a
// request been handed to a socket at least Timeout ago with no byte of
// reply since? Timing from the batcher's side cannot tell a frozen Redis
// from ratelimitd goroutines waiting for a CPU, and calling a live Redis
// failed would fail requests open. So each socket is wrapped (below TLS
// and go-redis) by a readConn that stamps when a write left a reply
// pending and clears the stamp when a read returns bytes, and a socket
// counts as stalled only when the kernel also holds no unread bytes
// (FIONREAD), and its read calls have taken from the kernel no byte
// that the readConn has not counted yet (TCP_INFO): a reader goroutine
// that got a reply from read(2) but was descheduled before it cleared
// the stamp is a starved ratelimitd, not a silent Redis. stalledAt
// answers per Cluster node, so a frozen master never makes the others
// look stalled.
type liveness struct {
	skip map[string]bool // addresses not to track (sentinels)
	// timeout is Options.Timeout: a socket closed before its request had
	// waited this long leaves no evidence (see readConn.Close); 0 keeps
	// every closed socket's evidence.
	timeout time.Duration
	now     func() time.Time // time.Now; tests pass a clock they advance
	epoch   time.Time        // origin of the readConns' stamps
	// unanswered keeps a stall's evidence past its socket: when a socket
	// is closed with a request pending and nothing unread (go-redis drops
	// a connection whose command timed out), the request's stamp (ns
	// since epoch), the earliest such; 0 after any read returns bytes.
	unanswered atomic.Int64
	// heard is when a read last returned bytes on any socket (ns since
	// epoch; 0: never).
	heard atomic.Int64
	mu    sync.Mutex
	conns map[*readConn]struct{}
	// nodes is the per-address evidence, by dialed "host:port".
	nodes map[string]*nodeLive
}

// nodeLive is the stall evidence of one node's sockets: unanswered and
// heard as in liveness, for reads on a socket to that node only.
type nodeLive struct{ unanswered, heard atomic.Int64 }

// heardSince reports whether a read returned bytes on a socket to addr
// ("": any socket) at or after t: Redis answered something since.
func (l *liveness) heardSince(addr string, t time.Time) bool {
	h := &l.heard
	if addr != "" {
		l.mu.Lock()
		n := l.nodes[addr]
		l.mu.Unlock()
		if n == nil {
			return false
		}
		h = &n.heard
	}
	v := h.Load()
	return v != 0 && v >= int64(t.Sub(l.epoch))
}

// newLiveness tracks every socket but those to the sentinels (when
// sentinel: their pub/sub connections receive messages unasked).
func newLiveness(sentinels []string, sentinel bool) *liveness {
	l := &liveness{skip: map[string]bool{}, now: time.Now, epoch: time.Now(), conns: map[*readConn]struct{}{}, nodes: map[string]*nodeLive{}}
	if sentinel {
		for _, a := range sentinels {
			l.skip[a] = true
		}
	}
	return l
}

func (l *liveness) clock() int64 { return int64(l.now().Sub(l.epoch)) }

// wrap tracks c, dialed to addr, and returns the connection to use in its
// place: c itself for a sentinel, else a readConn over it.
func (l *liveness) wrap(addr string, c *net.TCPConn) net.Conn {
	if l.skip[addr] {
		return c
	}
	l.mu.Lock()
	n := l.nodes[addr]
	if n == nil {
		n = &nodeLive{}
		l.nodes[addr] = n
	}
	rc := &readConn{TCPConn: c, l: l, addr: addr, node: n}
	l.conns[rc] = struct{}{}
	l.mu.Unlock()
	return rc
}

// stalled reports whether some tracked socket has had a request pending
// for at least timeout with no byte received since (none read, none
// waiting unread), or a socket closed so (see unanswered) with no byte
// received on any socket since, and since when (the earliest such
// request, as a time).
func (l *liveness) stalled(timeout time.Duration) (time.Time, bool) {
	return l.stalledAt("", timeout)
}

// stalledAt is stalled for the sockets dialed to addr only ("": every
// socket, as stalled), a closed socket's evidence ending with a byte
// received from addr.
func (l *liveness) stalledAt(addr string, timeout time.Duration) (time.Time, bool) {
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	var since int64
	switch n := l.nodes[addr]; {
	case addr == "":
		since = l.unanswered.Load()
	case n != nil:
		since = n.unanswered.Load()
	}
	if now-since < int64(timeout) {
		since = 0
	}
	for c := range l.conns {
		if addr != "" && c.addr != addr {
			continue
		}
		p := c.pendingSince.Load()
		if p == 0 || now-p < int64(timeout) {
			continue
		}
		if n, ok := c.unread(); !ok || n > 0 {
			continue // closed, or Redis answered and the reader is late
		}
		if c.readLate() {
			continue // Redis answered and the reader has not stamped it yet
		}
		if since == 0 || p < since {
			since = p
		}
	}
	if since == 0 {
		return time.Time{}, false
	}
	return l.epoch.Add(time.Duration(since)), true
}

// readConn is a *net.TCPConn (every method promoted, SyscallConn included,
// so go-redis' pool health check still sees the socket) that keeps
// pendingSince: when a write returned while no reply was pending (ns since
// liveness.epoch; 0: none pending), cleared by a read that returns bytes.
type readConn struct {
	*net.TCPConn
	l            *liveness
	addr         string    // as dialed
	node         *nodeLive // l.nodes[addr]
	pendingSince atomic.Int64
	// got is the number of bytes Read has returned, counted after the
	// stamps (see readLate).
	got atomic.Uint64
}

func (c *readConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	if n > 0 && c.pendingSince.Load() == 0 {
		c.pendingSince.CompareAndSwap(0, c.l.clock())
	}
	return n, err
}

func (c *readConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	if n > 0 {
		now := c.l.clock()
		c.l.heard.Store(now)
		c.node.heard.Store(now)
		if c.pendingSince.Load() != 0 {
			c.pendingSince.Store(0)
		}
		if c.l.unanswered.Load() != 0 {
			c.l.unanswered.Store(0)
		}
		if c.node.unanswered.Load() != 0 {
			c.node.unanswered.Store(0)
		}
		// Last: until now the kernel counts bytes read that got does
		// not, and readLate tells the stamps above are not done.
		c.got.Add(uint64(n))
	}
	return n, err
}

// readLate reports whether a read call took bytes from the kernel that
// Read has not counted yet (got): its goroutine has a reply but has not
// cleared pendingSince, being descheduled between read(2) and the stamps.
// False when the kernel does not say (outside Linux).
func (c *readConn) readLate() bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	n, ok := readBytes(rc)
	return ok && n > c.got.Load()
}

// Close forgets the socket and closes it; a request still pending with
// nothing unread that has waited at least liveness.timeout is kept as
// evidence (liveness.unanswered). One that waited less was given up by
// ratelimitd (go-redis drops a connection whose caller's deadline passed),
// not left unanswered by Redis, so it is not kept.
func (c *readConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	if p := c.pendingSince.Load(); p != 0 && c.l.clock()-p >= int64(c.l.timeout) {
		if n, ok := c.unread(); ok && n == 0 && !c.readLate() {
			keepEarliest(&c.l.unanswered, p)
			keepEarliest(&c.node.unanswered, p)
		}
	}
	return c.TCPConn.Close()
}

// unread is the number of bytes received on the socket and not read yet;
// ok is false once it is closed.
func (c *readConn) unread() (int, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	return pendingBytes(rc)
}

// keepEarliest stores p (ns since liveness.epoch) in u unless u holds an
// earlier stamp.
func keepEarliest(u *atomic.Int64, p int64) {
	for {
		v := u.Load()
		if (v != 0 && v <= p) || u.CompareAndSwap(v, p) {
			return
		}
	}
}
