package testproc

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// StatsdSink is a statsd server on a loopback UDP port that keeps every
// line of every datagram it receives. Safe for concurrent use.
type StatsdSink struct {
	pc        net.PacketConn
	mu        sync.Mutex
	datagrams int
	raw       []string // every datagram as received, in arrival order
	lines     []string // non-empty lines, in arrival order
	done      chan struct{}
}

// ListenStatsd starts a StatsdSink (with a 4 MiB socket read buffer, so
// that a burst of flushes is not dropped), closed when t ends.
func ListenStatsd(t testing.TB) *StatsdSink {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := pc.(*net.UDPConn); ok {
		_ = u.SetReadBuffer(4 << 20)
	}
	s := &StatsdSink{pc: pc, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 1<<16)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.datagrams++
			s.raw = append(s.raw, string(buf[:n]))
			for _, l := range strings.Split(string(buf[:n]), "\n") {
				if l != "" {
					s.lines = append(s.lines, l)
				}
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Close stops the sink (a later datagram to Addr is refused) and waits
// for its reader; what it received stays readable. Closing twice is
// harmless.
func (s *StatsdSink) Close() {
	_ = s.pc.Close()
	<-s.done
}

// Addr is the sink's host:port.
func (s *StatsdSink) Addr() string { return s.pc.LocalAddr().String() }

// Datagrams is the number of datagrams received so far.
func (s *StatsdSink) Datagrams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.datagrams
}

// WaitDatagrams waits up to 10 s until n datagrams in all have arrived
// (loopback delivers them in well under that) and returns every datagram
// received so far, each as sent; fewer fails t.
func (s *StatsdSink) WaitDatagrams(t testing.TB, n int) []string {
	t.Helper()
	var got []string
	s.waitFor(t, func() bool {
		got = slices.Clone(s.raw)
		return len(got) >= n
	}, func() string { return fmt.Sprintf("received %d datagrams, want %d", len(got), n) })
	return got
}

// WaitLine waits up to 10 s for a line that starts with prefix; none
// fails t.
func (s *StatsdSink) WaitLine(t testing.TB, prefix string) {
	t.Helper()
	s.waitFor(t, func() bool {
		return slices.ContainsFunc(s.lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
	}, func() string { return fmt.Sprintf("no line starting with %q within 10s", prefix) })
}

// waitFor calls done (with the sink locked) every 5 ms until it reports
// true, for up to 10 s; then it fails t with why().
func (s *StatsdSink) waitFor(t testing.TB, done func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		ok := done()
		s.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsd sink: %s", why())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Totals sums the lines received so far by "name|type": counters ("c")
// by value, gauges ("g") their last value, timers ("ms") counted as
// samples. bad lists the lines that are not name:value|type with a
// number value and one of those types (a sample rate included).
func (s *StatsdSink) Totals() (totals map[string]float64, bad []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	totals = map[string]float64{}
	for _, l := range s.lines {
		name, rest, ok1 := strings.Cut(l, ":")
		val, typ, ok2 := strings.Cut(rest, "|")
		v, err := strconv.ParseFloat(val, 64)
		switch {
		case !ok1 || !ok2 || err != nil:
			bad = append(bad, l)
		case typ == "c":
			totals[name+"|c"] += v
		case typ == "g":
			totals[name+"|g"] = v
		case typ == "ms":
			totals[name+"|ms"]++
		default:
			bad = append(bad, l)
		}
	}
	return totals, bad
}
