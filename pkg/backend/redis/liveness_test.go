package redis

import (
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// tcpPair is a connected client/server pair of loopback TCP sockets.
func tcpPair(t *testing.T) (client *net.TCPConn, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return c.(*net.TCPConn), s
}

// TestLivenessStallIsPerSocketAndKernelBased: a socket stalls once a
// request written to it has had no byte of reply for the timeout; bytes
// the server sent that wait unread (FIONREAD, Linux) or that a read
// returned end the stall, whoever is slow to read them; a closed socket
// is forgotten, but a request it left unanswered keeps the stall going
// until a byte arrives on any socket. The batcher's stalledLocked follows.
func TestLivenessStallIsPerSocketAndKernelBased(t *testing.T) {
	const timeout = 20 * time.Millisecond
	// The stamps are read on a clock the test moves: "a timeout later" is
	// exact.
	l, wait := manualLiveness()
	b := newBatcher(nil, 1, timeout, time.Second, 0)
	b.live = l
	stalled := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.stalledLocked()
	}
	c, srv := tcpPair(t)
	conn := l.wrap("redis:6379", c)
	if _, ok := l.stalled(timeout); ok || stalled() {
		t.Fatal("stalled with nothing written")
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.stalled(timeout); ok {
		t.Fatal("stalled at once after the write")
	}
	wait(timeout - 1)
	if _, ok := l.stalled(timeout); ok {
		t.Fatal("stalled 1 ns before a timeout after the write")
	}
	wait(1)
	since, ok := l.stalled(timeout)
	if !ok || !stalled() {
		t.Fatal("not stalled a timeout after a write with no reply")
	}
	if ago := l.now().Sub(since); ago != timeout {
		t.Errorf("stall since %v ago, want the timeout %v (the write's stamp)", ago, timeout)
	}

	if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" {
		deadline := time.Now().Add(20 * time.Second) // the kernel's delivery, generous
		for stalled() {
			if time.Now().After(deadline) {
				t.Fatal("still stalled although the reply waits unread in the socket")
			}
			time.Sleep(time.Millisecond)
		}
	}
	buf := make([]byte, 16)
	if n, err := conn.Read(buf); err != nil || n != 7 {
		t.Fatalf("read %d %v", n, err)
	}
	if stalled() {
		t.Error("stalled after the reply was read")
	}
	wait(2 * timeout)
	if stalled() {
		t.Error("stalled while idle (no request pending)")
	}

	// A request that times out and whose socket go-redis drops keeps its
	// evidence: the stall goes on until a byte arrives on any socket.
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	wait(2 * timeout)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if len(l.conns) != 0 {
		t.Errorf("%d sockets tracked after Close", len(l.conns))
	}
	if !stalled() {
		t.Error("the stall ended when its socket was closed, with nothing received")
	}
	c2, srv2 := tcpPair(t)
	conn2 := l.wrap("redis:6379", c2)
	if _, err := srv2.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := conn2.Read(buf); err != nil || n != 7 {
		t.Fatalf("read %d %v", n, err)
	}
	if stalled() {
		t.Error("stalled after a byte arrived on another socket")
	}
}

// manualLiveness is a liveness whose stamps are read on a clock that only
// wait moves (it starts 1 s after the epoch: a stamp of 0 means "none
// pending").
func manualLiveness() (*liveness, func(time.Duration)) {
	l := newLiveness(nil, false)
	var mu sync.Mutex
	now := l.epoch.Add(time.Second)
	l.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	return l, func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// TestLivenessCloseBeforeTimeoutIsNoEvidence: a socket closed with its
// request pending for less than the timeout (go-redis dropping it when
// its caller's deadline passed, moments after a starved ratelimitd wrote
// the request) leaves no stall behind, however long nothing arrives
// afterwards; one closed after its request waited the timeout does.
func TestLivenessCloseBeforeTimeoutIsNoEvidence(t *testing.T) {
	const timeout = 20 * time.Millisecond
	l, wait := manualLiveness()
	l.timeout = timeout
	for _, c := range []struct {
		waited  time.Duration
		stalled bool
	}{{timeout - 1, false}, {time.Millisecond, false}, {timeout, true}} {
		c0, _ := tcpPair(t)
		conn := l.wrap("redis:6379", c0)
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		wait(c.waited)
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		wait(10 * timeout)
		if _, ok := l.stalledAt("redis:6379", timeout); ok != c.stalled {
			t.Errorf("closed %v after its request was written, then nothing for %v: stalled %v, want %v", c.waited, 10*timeout, ok, c.stalled)
		}
		l.unanswered.Store(0)
		l.nodes["redis:6379"].unanswered.Store(0)
	}
}

// TestLivenessReaderDescheduledIsNoStall: a reply that a read call took
// from the kernel on a reader descheduled before it stamped it (here the
// read(2) is done on the bare socket, without readConn.Read's stamps) ends
// the stall as a reply waiting unread does: a CPU-starved ratelimitd is
// not a silent Redis. A socket to a peer that never answers still stalls
// next to it, and the late reader's socket leaves no evidence when closed.
func TestLivenessReaderDescheduledIsNoStall(t *testing.T) {
	const timeout = 20 * time.Millisecond
	l, wait := manualLiveness()
	l.timeout = timeout
	c, srv := tcpPair(t)
	conn := l.wrap("redis:6379", c).(*readConn)
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second) // the kernel's delivery, generous
	for {
		if n, ok := conn.unread(); ok && n == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reply did not arrive in the socket")
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || n != 7 {
		t.Fatalf("read %d %v", n, err)
	}
	wait(10 * timeout)
	if _, ok := l.stalledAt("redis:6379", timeout); ok && runtime.GOOS == "linux" {
		t.Error("stalled: a reply read from the kernel by a reader not yet past its stamps counts as Redis' silence")
	}

	c2, _ := tcpPair(t)
	silent := l.wrap("redis:6379", c2)
	if _, err := silent.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	wait(timeout)
	if _, ok := l.stalledAt("redis:6379", timeout); !ok {
		t.Error("not stalled: a request to a peer that never answers, a timeout ago")
	}
	if err := silent.Close(); err != nil {
		t.Fatal(err)
	}
	l.unanswered.Store(0)
	l.nodes["redis:6379"].unanswered.Store(0)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.stalledAt("redis:6379", timeout); ok && runtime.GOOS == "linux" {
		t.Error("stalled: the late reader's socket, closed, left its answered request as evidence")
	}
}
