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
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
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
