// Flushing: the sender loop, the lines of each stat and the datagrams.

package statsd

import (
	"context"
	"math"
	"net"
	"strconv"
	"time"
)

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
