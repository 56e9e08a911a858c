// Package statsd is a minimal statsd client over UDP (the plain statsd
// line protocol: "name:value|c" counters, "name:value|ms" timers,
// "name:value|g" gauges, one stat per line, each line ending in '\n', as
// github.com/lyft/gostats writes them). It exists so that ratelimitd can
// emit envoyproxy/ratelimit's statsd stats (docs/metrics.md, "statsd
// (reference names)") next to its native Prometheus metrics.
//
// Counters accumulate in memory (one atomic add per update) and their
// change since the previous flush is sent every FlushInterval; counters
// that did not change are not sent. Gauges are sent at every flush. Timer
// samples are queued and sent one line each within a second. Lines are
// batched into datagrams of at most MaxDatagramBytes. Nothing on the
// update path blocks or does I/O: a sample that finds the queue full is
// dropped and counted, as is every line of a datagram the socket refuses
// (ratelimitd_statsd_dropped_total).
package statsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults applied by New to zero Options fields.
const (
	// DefaultFlushInterval is envoyproxy/ratelimit's STATS_FLUSH_INTERVAL
	// default.
	DefaultFlushInterval = 10 * time.Second
	// DefaultMaxDatagramBytes keeps a datagram within one Ethernet frame
	// (1500-byte MTU less IPv6 and UDP headers, with room for tunnels);
	// gostats uses the same UDP buffer size.
	DefaultMaxDatagramBytes = 1432
	// DefaultQueueSize is the number of timer samples that may wait for
	// the sender.
	DefaultQueueSize = 1 << 14
)

// timerFlushInterval is the longest a queued timer sample waits before its
// datagram is sent (gostats' network sink flushes every second).
const timerFlushInterval = time.Second

// Drop reasons (label "reason" of ratelimitd_statsd_dropped_total).
const (
	// ReasonQueueFull: a timer sample found the queue full.
	ReasonQueueFull = "queue_full"
	// ReasonWriteError: the socket refused the datagram (no listener,
	// closed socket, full send buffer).
	ReasonWriteError = "write_error"
	// ReasonTooLong: a single line longer than MaxDatagramBytes.
	ReasonTooLong = "too_long"
)

// Options configure a Client.
type Options struct {
	// Addr is the statsd server, host:port (UDP). Required. The host is
	// resolved when the socket is connected: by New, or again later while
	// that failed.
	Addr string
	// FlushInterval is how often counters and gauges are sent. 0 means
	// DefaultFlushInterval; negative is invalid.
	FlushInterval time.Duration
	// MaxDatagramBytes bounds the payload of one datagram, in bytes. 0
	// means DefaultMaxDatagramBytes; it must be at least 64 and at most
	// 65507 (the largest UDP payload over IPv4).
	MaxDatagramBytes int
	// QueueSize is the number of timer samples that may wait for the
	// sender; beyond it samples are dropped (reason queue_full). 0 means
	// DefaultQueueSize.
	QueueSize int
	// Registerer receives ratelimitd_statsd_dropped_total and
	// ratelimitd_statsd_datagrams_total; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger logs the first write error after a success; nil means
	// slog.Default().
	Logger *slog.Logger
	// Tags are appended to every stat name as github.com/lyft/gostats
	// serializes tags into a name (envoyproxy/ratelimit's EXTRA_TAGS):
	// ".__key=value" per tag, sorted by key; a tag with an empty key or
	// value is dropped, and '.', ':' and '|' in a value become '_'.
	// nil or empty: names are sent as given.
	Tags map[string]string
}

// TagSuffix is the name suffix of tags in gostats' serialization (see
// Options.Tags): "" for no tags, else ".__k1=v1.__k2=v2" with the keys
// sorted.
func TagSuffix(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k, v := range tags {
		if k != "" && v != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(".__")
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strings.NewReplacer(".", "_", ":", "_", "|", "_").Replace(tags[k]))
	}
	return b.String()
}

// Client sends stats to one statsd server. It is safe for concurrent use.
// Start it with Run; stats updated before Run are sent by its first flush.
type Client struct {
	opts   Options
	suffix string // TagSuffix(opts.Tags)

	mu       sync.Mutex // guards the registries' insertions
	counters sync.Map   // name → *Counter
	gauges   sync.Map   // name → *Gauge
	timers   sync.Map   // name → *Timer
	gens     []func()   // generators run before each flush (mu)

	samples chan sample

	// flushMu serializes flushes (Run's loop and Flush) and guards what
	// follows.
	flushMu  sync.Mutex
	conn     net.Conn // nil until a dial succeeded
	lastDial time.Time
	closed   bool
	buf      []byte
	lines    int  // lines in buf
	failing  bool // the last write or dial failed (logged once)

	dropped   [3]atomic.Uint64 // by reason index
	datagrams atomic.Uint64
	promDrop  *prometheus.CounterVec
	promSent  prometheus.CounterFunc
}

type sample struct {
	t  *Timer
	ms float64
}

var reasons = [3]string{ReasonQueueFull, ReasonWriteError, ReasonTooLong}

// New validates o, registers the client's metrics and connects the UDP
// socket (no packet is sent). A host that does not resolve is not an
// error: it is logged, and tried again before later sends (at most once a
// second), their lines being dropped meanwhile.
func New(o Options) (*Client, error) {
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.MaxDatagramBytes == 0 {
		o.MaxDatagramBytes = DefaultMaxDatagramBytes
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.FlushInterval < 0:
		return nil, fmt.Errorf("statsd: negative flush interval %s", o.FlushInterval)
	case o.MaxDatagramBytes < 64 || o.MaxDatagramBytes > 65507:
		return nil, fmt.Errorf("statsd: datagram size %d outside [64, 65507]", o.MaxDatagramBytes)
	case o.QueueSize < 0:
		return nil, fmt.Errorf("statsd: negative queue size %d", o.QueueSize)
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return nil, fmt.Errorf("statsd: address %q: %w", o.Addr, err)
	}
	c := &Client{
		opts:    o,
		suffix:  TagSuffix(o.Tags),
		samples: make(chan sample, o.QueueSize),
		buf:     make([]byte, 0, o.MaxDatagramBytes),
	}
	c.dial()
	c.promDrop = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimitd_statsd_dropped_total",
		Help: "statsd lines not delivered to the socket, by reason: queue_full (timer sample queue full), write_error (datagram refused by the socket), too_long (one line longer than a datagram).",
	}, []string{"reason"})
	for _, r := range reasons {
		c.promDrop.WithLabelValues(r)
	}
	c.promSent = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimitd_statsd_datagrams_total",
		Help: "statsd datagrams written to the socket.",
	}, func() float64 { return float64(c.datagrams.Load()) })
	if o.Registerer != nil {
		if err := errors.Join(o.Registerer.Register(c.promDrop), o.Registerer.Register(c.promSent)); err != nil {
			if c.conn != nil {
				_ = c.conn.Close()
			}
			return nil, fmt.Errorf("statsd: register metrics: %w", err)
		}
	}
	return c, nil
}

// dial connects the UDP socket (resolving the host); on failure it logs,
// and send tries again at most once per redialInterval (flushMu held, or
// from New).
func (c *Client) dial() {
	c.lastDial = time.Now()
	conn, err := net.Dial("udp", c.opts.Addr)
	if err != nil {
		if !c.failing {
			c.failing = true
			c.opts.Logger.Warn("statsd: cannot resolve or connect; dropping stats until it can (ratelimitd_statsd_dropped_total)", "addr", c.opts.Addr, "err", err.Error())
		}
		return
	}
	c.conn = conn
}

// redialInterval is the shortest time between two attempts to connect the
// socket (a statsd host name that does not resolve yet).
const redialInterval = time.Second

// Dropped returns the number of lines dropped for reason (ReasonQueueFull,
// ReasonWriteError or ReasonTooLong; 0 for another string).
func (c *Client) Dropped(reason string) uint64 {
	for i, r := range reasons {
		if r == reason {
			return c.dropped[i].Load()
		}
	}
	return 0
}

func (c *Client) drop(i int, n int) {
	if n <= 0 {
		return
	}
	c.dropped[i].Add(uint64(n))
	c.promDrop.WithLabelValues(reasons[i]).Add(float64(n))
}

// Counter is a monotonically increasing count; its increase since the
// previous flush is sent as "name:delta|c".
type Counter struct {
	name string
	v    atomic.Uint64
	sent uint64 // value at the previous flush (flushMu)
}

// Add adds n (an atomic add; never blocks).
func (k *Counter) Add(n uint64) {
	if k != nil && n != 0 {
		k.v.Add(n)
	}
}

// Inc adds 1.
func (k *Counter) Inc() { k.Add(1) }

// Value returns the total added so far.
func (k *Counter) Value() uint64 { return k.v.Load() }

// Gauge is a value sent as "name:value|g" at every flush.
type Gauge struct {
	name string
	v    atomic.Uint64
}

// Set sets the value.
func (g *Gauge) Set(v uint64) {
	if g != nil {
		g.v.Store(v)
	}
}

// Timer sends each recorded duration as "name:ms|ms".
type Timer struct {
	name string
	c    *Client
}

// Record queues one sample of d (sent in milliseconds, with microsecond
// resolution). A full queue drops it (counted, reason queue_full).
func (t *Timer) Record(d time.Duration) {
	if t == nil {
		return
	}
	select {
	case t.c.samples <- sample{t: t, ms: float64(d.Microseconds()) / 1000}:
	default:
		t.c.drop(0, 1)
	}
}

// Counter returns the counter called name, creating it on first use.
// Repeated calls with one name return the same *Counter. The name, with
// Options.Tags appended, is made safe for the line protocol (see
// Sanitize).
func (c *Client) Counter(name string) *Counter {
	return stat(c, &c.counters, name, func(n string) *Counter { return &Counter{name: n} })
}

// Gauge returns the gauge called name, creating it on first use.
func (c *Client) Gauge(name string) *Gauge {
	return stat(c, &c.gauges, name, func(n string) *Gauge { return &Gauge{name: n} })
}

// Timer returns the timer called name, creating it on first use.
func (c *Client) Timer(name string) *Timer {
	return stat(c, &c.timers, name, func(n string) *Timer { return &Timer{name: n, c: c} })
}

// stat returns the stat called name in m (Client.counters, gauges or
// timers), made by newStat from its line-protocol name (Options.Tags
// appended, Sanitize) and stored on first use, under c.mu so that one
// name never makes two.
func stat[T any](c *Client, m *sync.Map, name string, newStat func(string) *T) *T {
	if v, ok := m.Load(name); ok {
		return v.(*T)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := m.Load(name); ok {
		return v.(*T)
	}
	st := newStat(Sanitize(name + c.suffix))
	m.Store(name, st)
	return st
}

// AddGenerator registers f, called before every flush of counters and
// gauges (to set gauges from a snapshot, as gostats' stat generators do).
func (c *Client) AddGenerator(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gens = append(c.gens, f)
}

// Sanitize makes name safe as a statsd stat name: ':' and '|' (the line
// protocol's separators) and ASCII control characters, '\n' among them,
// become '_'.
func Sanitize(name string) string {
	ok := true
	for i := 0; i < len(name); i++ {
		if b := name[i]; b == ':' || b == '|' || b < 0x20 || b == 0x7f {
			ok = false
			break
		}
	}
	if ok {
		return name
	}
	b := []byte(name)
	for i, ch := range b {
		if ch == ':' || ch == '|' || ch < 0x20 || ch == 0x7f {
			b[i] = '_'
		}
	}
	return string(b)
}

// Run sends stats until ctx is done, then flushes once more. It returns
// nil. Call it once, on its own goroutine.
func (c *Client) Run(ctx context.Context) error {
	flush := time.NewTicker(c.opts.FlushInterval)
	defer flush.Stop()
	tick := time.NewTicker(min(timerFlushInterval, c.opts.FlushInterval))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.Flush()
			return nil
		case <-flush.C:
			c.Flush()
		case <-tick.C:
			c.flushMu.Lock()
			c.drainSamples()
			c.send()
			c.flushMu.Unlock()
		case s := <-c.samples:
			c.flushMu.Lock()
			c.appendTimer(s)
			c.drainSamples()
			c.flushMu.Unlock()
		}
	}
}

// Flush sends every queued timer sample, the change of every counter
// since the previous flush and every gauge, now, and returns when they
// were written to the socket (or dropped).
func (c *Client) Flush() {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.mu.Lock()
	gens := c.gens
	c.mu.Unlock()
	for _, g := range gens {
		g()
	}
	c.drainSamples()
	c.counters.Range(func(_, v any) bool {
		k := v.(*Counter)
		now := k.v.Load()
		if d := now - k.sent; d != 0 {
			k.sent = now
			c.appendLine(k.name, strconv.AppendUint(nil, d, 10), "|c\n")
		}
		return true
	})
	c.gauges.Range(func(_, v any) bool {
		g := v.(*Gauge)
		c.appendLine(g.name, strconv.AppendUint(nil, g.v.Load(), 10), "|g\n")
		return true
	})
	c.send()
}

// drainSamples appends the samples queued now (flushMu held).
func (c *Client) drainSamples() {
	for n := len(c.samples); n > 0; n-- {
		select {
		case s := <-c.samples:
			c.appendTimer(s)
		default:
			return
		}
	}
}

func (c *Client) appendTimer(s sample) {
	var v []byte
	if s.ms >= 0 && s.ms < math.MaxUint32 && math.Trunc(s.ms) == s.ms {
		v = strconv.AppendUint(nil, uint64(s.ms), 10)
	} else {
		v = strconv.AppendFloat(nil, s.ms, 'f', -1, 64)
	}
	c.appendLine(s.t.name, v, "|ms\n")
}

// appendLine adds "name:value<suffix>" to the datagram being built,
// sending it first when the line would not fit (flushMu held).
func (c *Client) appendLine(name string, value []byte, suffix string) {
	n := len(name) + 1 + len(value) + len(suffix)
	if n > c.opts.MaxDatagramBytes {
		c.drop(2, 1)
		return
	}
	if len(c.buf)+n > c.opts.MaxDatagramBytes {
		c.send()
	}
	c.buf = append(c.buf, name...)
	c.buf = append(c.buf, ':')
	c.buf = append(c.buf, value...)
	c.buf = append(c.buf, suffix...)
	c.lines++
}

// sendTimeout bounds one datagram write (a full socket send buffer).
const sendTimeout = 100 * time.Millisecond

// send writes the datagram being built (flushMu held).
func (c *Client) send() {
	if len(c.buf) == 0 {
		return
	}
	if c.conn == nil && !c.closed && time.Since(c.lastDial) >= redialInterval {
		c.dial()
	}
	err := net.ErrClosed
	if c.conn != nil && !c.closed {
		_ = c.conn.SetWriteDeadline(time.Now().Add(sendTimeout))
		_, err = c.conn.Write(c.buf)
	}
	if err != nil {
		c.drop(1, c.lines)
		if !c.failing {
			c.failing = true
			c.opts.Logger.Warn("statsd: datagram not sent; dropping stats until the socket accepts them again (ratelimitd_statsd_dropped_total)", "addr", c.opts.Addr, "err", err.Error())
		}
	} else {
		c.datagrams.Add(1)
		c.failing = false
	}
	c.buf = c.buf[:0]
	c.lines = 0
}

// Close closes the socket. Call it after Run returned; later flushes count
// their lines as dropped.
func (c *Client) Close() error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.closed = true
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// AddRuntimeStats registers a generator that sets gostats' Go runtime
// stats under prefix (envoyproxy/ratelimit uses "ratelimit.go") at every
// flush: gauges alloc, sys, heapAlloc, heapSys, heapIdle, heapInuse,
// heapReleased, heapObjects, nextGC, lastGC, gcCPUPercent, numGoroutine,
// and counters totalAlloc, mallocs, frees, pauseTotalNs, numGC (their
// increase since the previous flush).
func (c *Client) AddRuntimeStats(prefix string) {
	p := prefix + "."
	g := func(n string) *Gauge { return c.Gauge(p + n) }
	alloc, sys, heapAlloc, heapSys := g("alloc"), g("sys"), g("heapAlloc"), g("heapSys")
	heapIdle, heapInuse, heapReleased, heapObjects := g("heapIdle"), g("heapInuse"), g("heapReleased"), g("heapObjects")
	nextGC, lastGC, gcCPU, goroutines := g("nextGC"), g("lastGC"), g("gcCPUPercent"), g("numGoroutine")
	type total struct {
		k    *Counter
		prev uint64
	}
	totals := map[string]*total{}
	for _, n := range []string{"totalAlloc", "mallocs", "frees", "pauseTotalNs", "numGC"} {
		totals[n] = &total{k: c.Counter(p + n)}
	}
	set := func(n string, v uint64) {
		t := totals[n]
		if v > t.prev {
			t.k.Add(v - t.prev)
		}
		t.prev = v
	}
	c.AddGenerator(func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		alloc.Set(m.Alloc)
		sys.Set(m.Sys)
		heapAlloc.Set(m.HeapAlloc)
		heapSys.Set(m.HeapSys)
		heapIdle.Set(m.HeapIdle)
		heapInuse.Set(m.HeapInuse)
		heapReleased.Set(m.HeapReleased)
		heapObjects.Set(m.HeapObjects)
		nextGC.Set(m.NextGC)
		lastGC.Set(m.LastGC)
		gcCPU.Set(uint64(m.GCCPUFraction * 100))
		goroutines.Set(uint64(runtime.NumGoroutine()))
		set("totalAlloc", m.TotalAlloc)
		set("mallocs", m.Mallocs)
		set("frees", m.Frees)
		set("pauseTotalNs", m.PauseTotalNs)
		set("numGC", uint64(m.NumGC))
	})
}
