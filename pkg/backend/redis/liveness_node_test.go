package redis

import (
	"testing"
	"time"
)

// TestLivenessStallIsPerNode: a node whose socket stalls (a frozen
// Cluster master) is stalled for its own address and for the every-socket
// view, never for another node's; a byte from another node ends neither
// its stall nor the evidence its closed socket left, while the
// every-socket view (standalone, Sentinel) ends with any byte.
// A batcher with liveAddr follows its node only.
func TestLivenessStallIsPerNode(t *testing.T) {
	const timeout = 20 * time.Millisecond
	l, wait := manualLiveness()
	const frozen, live = "10.0.0.1:6379", "10.0.0.2:6379"
	batcherOf := func(addr string) func() bool {
		b := newBatcher(nil, 1, timeout, time.Second, 0)
		b.live, b.liveAddr = l, addr
		return func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.stalledLocked()
		}
	}
	frozenStalled, liveStalled, anyStalled := batcherOf(frozen), batcherOf(live), batcherOf("")

	buf := make([]byte, 16)
	// answer has srv reply +PONG and conn read it.
	answer := func(conn interface{ Read([]byte) (int, error) }, srv interface{ Write([]byte) (int, error) }) {
		t.Helper()
		if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
			t.Fatal(err)
		}
		if n, err := conn.Read(buf); err != nil || n != 7 {
			t.Fatalf("read %d %v", n, err)
		}
	}
	fc, _ := tcpPair(t)
	lc, lsrv := tcpPair(t)
	fconn, lconn := l.wrap(frozen, fc), l.wrap(live, lc)
	for _, c := range []interface{ Write([]byte) (int, error) }{fconn, lconn} {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	answer(lconn, lsrv) // the live node answers; the frozen one does not
	wait(timeout)
	if !frozenStalled() || !anyStalled() {
		t.Fatalf("a timeout after an unanswered write: frozen node stalled %v, every-socket view %v; want both", frozenStalled(), anyStalled())
	}
	if liveStalled() {
		t.Fatal("the live node is stalled because another node froze")
	}
	if _, ok := l.stalledAt(live, timeout); ok {
		t.Fatal("stalledAt(live) with only the frozen node's socket pending")
	}

	// The frozen node's socket is dropped with its request unanswered: its
	// evidence stays for its node until a byte comes from that node,
	// whatever the other nodes answer.
	if err := fconn.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lconn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	answer(lconn, lsrv)
	if !frozenStalled() {
		t.Error("the frozen node's stall ended with a byte from another node")
	}
	if anyStalled() {
		t.Error("the every-socket view is still stalled after a byte arrived on a socket")
	}
	if liveStalled() {
		t.Error("the live node is stalled")
	}
	fc2, fsrv2 := tcpPair(t)
	answer(l.wrap(frozen, fc2), fsrv2)
	if frozenStalled() {
		t.Error("the frozen node is still stalled after a byte from it")
	}
}
