package runner

import (
	"bytes"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gostats "github.com/lyft/gostats"
)

// values is gostats.Store under a name that does not hide its Store method
// when embedded.
type values = gostats.Store

// flushMarker is a gauge ratelimitd's statsd sink sends at every flush
// (gostats' Go runtime stats under "ratelimit.go"); each line of it received
// counts one flush.
const flushMarker = "ratelimit.go.alloc"

// statsStore is the gostats.Store the suite reads through
// Runner.GetStatsStore, fed by a UDP listener of ratelimitd's statsd lines:
// counters add, gauges set, timers are dropped. Tagged names arrive
// serialized ("name.__k=v"), the form gostats' NewCounterWithTags looks up.
//
// The reference's in-process counters change the moment a request is
// handled; these change when ratelimitd's next flush arrives. So Flush waits
// for ratelimitd to have flushed twice since the call, and a counter's or
// gauge's Value does the same when a gRPC response passed the proxy (see
// proxy.go) since the last wait began.
type statsStore struct {
	values // the values; its own sink is a null sink

	conn     net.PacketConn
	interval time.Duration

	mu      sync.Mutex
	cond    *sync.Cond
	flushes uint64 // flush markers received
	closed  bool

	traffic     atomic.Int64 // UnixNano of the last response sent to a client
	lastSync    atomic.Int64 // UnixNano at which the last completed wait began
	lastSyncEnd atomic.Int64 // UnixNano at which it ended
}

func newStatsStore(interval time.Duration) (*statsStore, error) {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &statsStore{values: gostats.NewStore(gostats.NewNullSink(), false), conn: conn, interval: interval}
	s.cond = sync.NewCond(&s.mu)
	s.traffic.Store(time.Now().UnixNano())
	go s.read()
	return s, nil
}

// port is the listener's UDP port, for STATSD_PORT (STATSD_HOST is
// 127.0.0.1).
func (s *statsStore) port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

func (s *statsStore) read() {
	buf := make([]byte, 65536)
	for {
		n, _, err := s.conn.ReadFrom(buf)
		if err != nil {
			s.mu.Lock()
			s.closed = true
			s.cond.Broadcast()
			s.mu.Unlock()
			return
		}
		markers := 0
		for _, line := range bytes.Split(buf[:n], []byte{'\n'}) {
			if s.apply(line) {
				markers++
			}
		}
		if markers > 0 {
			s.mu.Lock()
			s.flushes += uint64(markers)
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}
}

// apply records one statsd line; it reports whether it was the flush marker.
func (s *statsStore) apply(line []byte) bool {
	colon := bytes.LastIndexByte(line, ':')
	bar := bytes.LastIndexByte(line, '|')
	if colon <= 0 || bar < colon {
		return false
	}
	name := string(line[:colon])
	value := string(line[colon+1 : bar])
	kind := string(line[bar+1:])
	switch kind {
	case "c":
		if v, err := strconv.ParseUint(value, 10, 64); err == nil {
			s.values.NewCounter(name).Add(v)
		}
	case "g":
		if v, err := strconv.ParseUint(value, 10, 64); err == nil {
			s.values.NewGauge(name).Set(v)
		}
		// With EXTRA_TAGS the marker carries the tags (".__k=v").
		return name == flushMarker || strings.HasPrefix(name, flushMarker+".__")
	case "ms":
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			s.values.NewTimer(name).AddValue(v)
		}
	}
	return false
}

// syncTimeout bounds one wait: ratelimitd flushes every s.interval, so a wait
// this long means it stopped sending (exited, or stats are disabled).
const syncTimeout = 5 * time.Second

// sync waits until ratelimitd flushed at least twice since the call and the
// flush after those began arriving (so the second is complete), and at least
// 2.5 flush intervals passed: then every stat updated before the call has
// arrived.
func (s *statsStore) sync() {
	start := time.Now()
	s.mu.Lock()
	want := s.flushes + 3
	timer := time.AfterFunc(syncTimeout, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	for s.flushes < want && !s.closed && time.Since(start) < syncTimeout {
		s.cond.Wait()
	}
	if s.flushes == 0 && !s.closed {
		// Nothing ever arrived: ratelimitd sends no statsd; do not wait
		// again.
		s.closed = true
		log.Printf("refsuite runner: no statsd flush from ratelimitd within %s; stats read as they are", syncTimeout)
	}
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return
	}
	timer.Stop()
	if rest := s.interval*5/2 - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
	s.lastSync.Store(start.UnixNano())
	s.lastSyncEnd.Store(time.Now().UnixNano())
}

// syncIfDirty waits as sync does when a response reached a client since the
// last wait began.
func (s *statsStore) syncIfDirty() {
	if s.traffic.Load() >= s.lastSync.Load() {
		s.sync()
	}
}

func (s *statsStore) markTraffic() { s.traffic.Store(time.Now().UnixNano()) }

// close stops the listener; later waits return at once.
func (s *statsStore) close() { _ = s.conn.Close() }

// disable makes every later wait return at once (ratelimitd exited, or its
// stats are disabled).
func (s *statsStore) disable() {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// flushFresh is how recent a completed wait must be for Flush to rely on
// it when no response was served since: the suite calls Flush right after
// reading counters, and every wait makes its loops slower (and so likelier
// to cross the boundary of a fixed window).
const flushFresh = 100 * time.Millisecond

// Flush waits for ratelimitd's stats to arrive (see sync), unless a wait
// that began after the last response ended less than flushFresh ago. Stats
// that change without a request (config_load_success after a reload) are
// read by the suite after it slept a second, so they get a wait.
func (s *statsStore) Flush() {
	if s.traffic.Load() < s.lastSync.Load() && time.Since(time.Unix(0, s.lastSyncEnd.Load())) < flushFresh {
		return
	}
	s.sync()
}

func (s *statsStore) NewCounter(name string) gostats.Counter {
	return syncCounter{s.values.NewCounter(name), s}
}

func (s *statsStore) NewCounterWithTags(name string, tags map[string]string) gostats.Counter {
	return syncCounter{s.values.NewCounterWithTags(name, tags), s}
}

func (s *statsStore) NewGauge(name string) gostats.Gauge {
	return syncGauge{s.values.NewGauge(name), s}
}

func (s *statsStore) NewGaugeWithTags(name string, tags map[string]string) gostats.Gauge {
	return syncGauge{s.values.NewGaugeWithTags(name, tags), s}
}

type syncCounter struct {
	gostats.Counter
	s *statsStore
}

func (c syncCounter) Value() uint64 {
	c.s.syncIfDirty()
	return c.Counter.Value()
}

func (c syncCounter) String() string {
	c.s.syncIfDirty()
	return c.Counter.String()
}

type syncGauge struct {
	gostats.Gauge
	s *statsStore
}

func (g syncGauge) Value() uint64 {
	g.s.syncIfDirty()
	return g.Gauge.Value()
}

func (g syncGauge) String() string {
	g.s.syncIfDirty()
	return g.Gauge.String()
}
