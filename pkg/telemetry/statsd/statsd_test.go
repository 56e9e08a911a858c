package statsd

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newClient(t *testing.T, o Options) *Client {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = time.Hour
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestLineFormatAndDeltas: a flush sends timers, counters' changes and
// gauges in the statsd line format; unchanged counters are not sent.
func TestLineFormatAndDeltas(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr()})
	k := c.Counter("a.b.total_hits")
	k.Add(3)
	k.Inc()
	c.Counter("a.idle") // never changed: never sent
	c.Gauge("g.x").Set(42)
	c.Timer("t.rt").Record(1500 * time.Microsecond)
	c.Timer("t.rt").Record(2 * time.Millisecond)
	c.Flush()
	got := l.WaitDatagrams(t, 1)
	want := "t.rt:1.5|ms\nt.rt:2|ms\na.b.total_hits:4|c\ng.x:42|g\n"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("datagrams %q, want [%q]", got, want)
	}
	// Next flush: only the counter's change, and the gauge again.
	k.Add(2)
	c.Flush()
	got = l.WaitDatagrams(t, 2)
	if got[1] != "a.b.total_hits:2|c\ng.x:42|g\n" {
		t.Errorf("second datagram %q", got[1])
	}
}

// TestBatchesBelowDatagramSize: lines are batched into datagrams of at
// most MaxDatagramBytes, none split, none lost.
func TestBatchesBelowDatagramSize(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr(), MaxDatagramBytes: 200})
	const n = 100
	for i := range n {
		c.Counter("ratelimit.service.rate_limit.domain.key_" + strconv.Itoa(i) + ".total_hits").Add(uint64(i + 1))
	}
	c.Flush()
	sent := int(c.datagrams.Load())
	if sent < 2 {
		t.Fatalf("%d datagrams for %d lines of ~50 bytes in 200-byte datagrams", sent, n)
	}
	lines := 0
	for _, dg := range l.WaitDatagrams(t, sent) {
		if len(dg) > 200 {
			t.Errorf("datagram of %d bytes > 200", len(dg))
		}
		if !strings.HasSuffix(dg, "\n") {
			t.Errorf("datagram %q splits a line", dg)
		}
		lines += strings.Count(dg, "\n")
	}
	if lines != n {
		t.Errorf("%d lines received, want %d", lines, n)
	}
	// A line that cannot fit one datagram is dropped and counted.
	c.Counter(strings.Repeat("x", 300)).Inc()
	c.Flush()
	if got := c.Dropped(ReasonTooLong); got != 1 {
		t.Errorf("too_long drops %d, want 1", got)
	}
}

// TestSanitize: Sanitize replaces the characters that would break a
// statsd line.
func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"a.b":           "a.b",
		"a:b|c":         "a_b_c",
		"a\nb:1|c\nx":   "a_b_1_c_x",
		"tab\there\x7f": "tab_here_",
	} {
		if got := Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestQueueFullDrops: a full sample queue drops timer samples without
// blocking and counts them; counters never drop.
func TestQueueFullDrops(t *testing.T) {
	l := testproc.ListenStatsd(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, Options{Addr: l.Addr(), QueueSize: 4, Registerer: reg})
	tm := c.Timer("t")
	for range 10 {
		tm.Record(time.Millisecond)
	}
	if got := c.Dropped(ReasonQueueFull); got != 6 {
		t.Errorf("queue_full drops %d, want 6", got)
	}
	if got := testutil.ToFloat64(c.promDrop.WithLabelValues(ReasonQueueFull)); got != 6 {
		t.Errorf("ratelimitd_statsd_dropped_total{reason=queue_full} = %v, want 6", got)
	}
	c.Flush()
	if got := l.WaitDatagrams(t, 1)[0]; strings.Count(got, "t:1|ms\n") != 4 {
		t.Errorf("datagram %q, want the 4 queued samples", got)
	}
}

// TestUnwritableSocketDrops: an unwritable socket drops the datagram's
// lines and counts them.
func TestUnwritableSocketDrops(t *testing.T) {
	l := testproc.ListenStatsd(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, Options{Addr: l.Addr(), Registerer: reg})
	c.Counter("a").Inc()
	c.Counter("b").Inc()
	_ = c.conn.Close() // the socket is gone under the client
	c.Flush()
	if got := c.Dropped(ReasonWriteError); got != 2 {
		t.Errorf("write_error drops %d, want 2", got)
	}
	if got := testutil.ToFloat64(c.promDrop.WithLabelValues(ReasonWriteError)); got != 2 {
		t.Errorf("ratelimitd_statsd_dropped_total{reason=write_error} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(c.promSent); got != 0 {
		t.Errorf("datagrams %v, want 0", got)
	}
}

// TestNoListenerDrops: with nobody listening, the kernel refuses later
// datagrams (ICMP port unreachable on loopback): they are dropped and
// counted, and Flush does not block.
func TestNoListenerDrops(t *testing.T) {
	l := testproc.ListenStatsd(t)
	addr := l.Addr()
	l.Close()
	c := newClient(t, Options{Addr: addr})
	k := c.Counter("a")
	deadline := time.Now().Add(10 * time.Second)
	for c.Dropped(ReasonWriteError) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no write error after 10 s of sends to a closed port")
		}
		k.Inc()
		c.Flush()
		time.Sleep(time.Millisecond)
	}
}

// TestUnresolvableHost: a host that does not resolve is not fatal: lines
// are dropped until it does.
func TestUnresolvableHost(t *testing.T) {
	c := newClient(t, Options{Addr: "no-such-host.invalid:8125"})
	c.Counter("a").Inc()
	c.Flush()
	if got := c.Dropped(ReasonWriteError); got != 1 {
		t.Errorf("write_error drops %d, want 1", got)
	}
}

// TestRun: Run sends timer samples within about a second and counters at
// the flush interval, and flushes on cancel.
func TestRun(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr(), FlushInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	c.Timer("t").Record(3 * time.Millisecond)
	if got := l.WaitDatagrams(t, 1)[0]; got != "t:3|ms\n" {
		t.Errorf("timer datagram %q", got)
	}
	c.Counter("k").Add(7)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := l.WaitDatagrams(t, 2)[1]; got != "k:7|c\n" {
		t.Errorf("final flush %q", got)
	}
}

// TestOptionsValidate: New refuses an address without a port and
// out-of-range intervals, datagram sizes and queue sizes.
func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Addr: "nohostport"},
		{Addr: "127.0.0.1:1", FlushInterval: -1},
		{Addr: "127.0.0.1:1", MaxDatagramBytes: 10},
		{Addr: "127.0.0.1:1", MaxDatagramBytes: 70000},
		{Addr: "127.0.0.1:1", QueueSize: -1},
	} {
		if c, err := New(o); err == nil {
			_ = c.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestConcurrentAddsAndFlushes: counter updates racing with flushes are
// each sent exactly once.
func TestConcurrentAddsAndFlushes(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr()})
	k := c.Counter("k")
	const workers, adds = 4, 2000
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				k.Add(2)
			}
		}()
	}
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for range 200 { // at most 200 datagrams: none lost on loopback
			select {
			case <-stop:
				return
			default:
				c.Flush()
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-flushed
	c.Flush()
	dgs := l.WaitDatagrams(t, int(c.datagrams.Load()))
	sum := 0
	for _, dg := range dgs {
		for _, line := range strings.Split(strings.TrimSuffix(dg, "\n"), "\n") {
			v, ok := strings.CutPrefix(line, "k:")
			if !ok {
				t.Fatalf("line %q", line)
			}
			n, err := strconv.Atoi(strings.TrimSuffix(v, "|c"))
			if err != nil {
				t.Fatal(err)
			}
			sum += n
		}
	}
	if sum != workers*adds*2 {
		t.Errorf("sum of sent deltas %d, want %d", sum, workers*adds*2)
	}
}

// TestTagsInNames: tags are serialized into every name as gostats does:
// ".__k=v" sorted by key, empty keys or values dropped, '.', ':' and '|' of
// a value made '_'.
func TestTagsInNames(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr(), Tags: map[string]string{"foo": "bar", "a": "b", "z": "", "": "x", "v": "1.2:3|4"}})
	c.Counter("ratelimit.service.rate_limit.basic.key1.total_hits").Inc()
	c.Gauge("ratelimit.localcache.hitCount").Set(7)
	c.Timer("ratelimit_server.ShouldRateLimit.response_time").Record(time.Millisecond)
	c.Flush()
	got := l.WaitDatagrams(t, 1)
	const tags = ".__a=b.__foo=bar.__v=1_2_3_4"
	want := "ratelimit_server.ShouldRateLimit.response_time" + tags + ":1|ms\n" +
		"ratelimit.service.rate_limit.basic.key1.total_hits" + tags + ":1|c\n" +
		"ratelimit.localcache.hitCount" + tags + ":7|g\n"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("datagrams %q, want [%q]", got, want)
	}
	if s := TagSuffix(map[string]string{"foo": "bar", "a": "b"}); s != ".__a=b.__foo=bar" {
		t.Errorf("TagSuffix = %q", s)
	}
	if s := TagSuffix(nil); s != "" {
		t.Errorf("TagSuffix(nil) = %q", s)
	}
}

// TestStart: Start sends as Run does; stop flushes what is left before it
// returns.
func TestStart(t *testing.T) {
	l := testproc.ListenStatsd(t)
	c := newClient(t, Options{Addr: l.Addr(), FlushInterval: time.Hour})
	stop := c.Start()
	c.Timer("t").Record(3 * time.Millisecond)
	if got := l.WaitDatagrams(t, 1)[0]; got != "t:3|ms\n" {
		t.Errorf("timer datagram %q", got)
	}
	c.Counter("k").Add(7)
	stop()
	if got := l.WaitDatagrams(t, 2)[1]; got != "k:7|c\n" {
		t.Errorf("final flush %q", got)
	}
}
