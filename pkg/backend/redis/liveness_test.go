package redis

import (
	"net"
	"runtime"
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

// TestLivenessSeesWhatRedisSent: a silence counted from the batcher's
// clock is not a stall when Redis' bytes wait unread in the socket
// (FIONREAD, Linux) or were read since it began (the readConn's stamp);
// it is when neither: a frozen server.
func TestLivenessSeesWhatRedisSent(t *testing.T) {
	l := newLiveness(nil, false)
	b := newBatcher(nil, 1, 10*time.Millisecond, time.Second, 0)
	b.live = l
	c, srv := tcpPair(t)
	conn := l.wrap("redis:6379", c)

	b.mu.Lock()
	b.silentFrom = b.clock() - int64(time.Second) // silent for a second
	if !b.stalledLocked(b.clock()) {
		t.Error("not stalled: nothing was sent, nothing read")
	}
	b.mu.Unlock()

	if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" {
		deadline := time.Now().Add(2 * time.Second)
		for !l.unread() {
			if time.Now().After(deadline) {
				t.Fatal("FIONREAD never saw the 7 bytes sent")
			}
			time.Sleep(time.Millisecond)
		}
		b.mu.Lock()
		b.silentFrom = b.clock() - int64(time.Second)
		if b.stalledLocked(b.clock()) {
			t.Error("stalled although the server's bytes wait unread in the socket")
		}
		b.mu.Unlock()
	}

	b.mu.Lock()
	b.silentFrom = b.clock() - int64(time.Second)
	b.mu.Unlock()
	buf := make([]byte, 16)
	if n, err := conn.Read(buf); err != nil || n != 7 {
		t.Fatalf("read %d %v", n, err)
	}
	if l.unread() {
		t.Error("unread bytes after they were read")
	}
	b.mu.Lock()
	if b.stalledLocked(b.clock()) {
		t.Error("stalled although bytes were read after the silence began")
	}
	// A new silence after that read, with nothing more sent: a stall.
	b.silentFrom = b.clock() + int64(time.Millisecond)
	if !b.stalledLocked(b.silentFrom + int64(20*time.Millisecond)) {
		t.Error("not stalled 20 ms into a silence with nothing read or unread")
	}
	b.mu.Unlock()

	_ = c.Close()
	if l.unread() || len(l.rcs) != 0 {
		t.Errorf("a closed socket is still tracked (%d)", len(l.rcs))
	}
}
