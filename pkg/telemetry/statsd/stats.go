// The stats a Client sends: counters, gauges and timers, and their names.

package statsd

import (
	"sync"
	"sync/atomic"
	"time"
)

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
