package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

const (
	// shouldRateLimitPath is the gRPC method Envoy calls (the :path of every
	// request).
	shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// h2Window is the receive window rlload grants, per stream
	// (SETTINGS_INITIAL_WINDOW_SIZE) and for the connection (by
	// WINDOW_UPDATE), in bytes: 1 GiB, so the server never waits for credit.
	h2Window = 1 << 30
	// h2DefaultWindow is the initial connection window of RFC 9113 §6.9.2.
	h2DefaultWindow = 65535
	// maxStreamID is the largest client stream identifier (RFC 9113 §5.1.1).
	maxStreamID = 1<<31 - 1
	// maxResponse bounds one buffered response message, in bytes.
	maxResponse = 1 << 20
	// overLimitCode is RateLimitResponse.Code OVER_LIMIT.
	overLimitCode = int32(rlsv3.RateLimitResponse_OVER_LIMIT)
)

// h2Driver is --client h2: gRPC over HTTP/2 prior knowledge (h2c) framed by
// hand. Each of --conns connections has a writer and a reader goroutine and
// a fixed share of the --concurrency calls in flight ("slots"); when a
// call's answer arrives the reader records it and queues the slot's next
// call for the writer, which opens every queued stream and flushes them in
// one write.
type h2Driver struct {
	c     config
	ld    *load
	msgs  [][]byte // per key: the 5-byte gRPC prefix + marshalled RateLimitRequest
	hdrs  []hpack.HeaderField
	conns []*h2Conn
	quit  chan struct{}
	wg    sync.WaitGroup
	// failed counts connections ended by an error; lost is closed when all
	// of them have (a --requests run cannot finish then).
	failed atomic.Int32
	lost   chan struct{}
}

func newH2Driver(c config, ld *load, reqs []*rlsv3.RateLimitRequest) (*h2Driver, error) {
	d := &h2Driver{c: c, ld: ld, msgs: make([][]byte, len(reqs)), quit: make(chan struct{}), lost: make(chan struct{})}
	for i, r := range reqs {
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("rlload: marshal request %d: %w", i, err)
		}
		d.msgs[i] = grpcFrame(b)
	}
	d.hdrs = []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: shouldRateLimitPath},
		{Name: ":authority", Value: c.addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
		{Name: "grpc-timeout", Value: grpcTimeout(c.timeout)},
	}
	return d, nil
}

// grpcFrame prefixes a marshalled message with the gRPC length-prefixed
// message header: compressed flag 0, 4-byte big-endian length.
func grpcFrame(msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// grpcTimeout encodes d as a grpc-timeout header value (at most 8 digits and
// a unit, gRPC over HTTP/2 protocol), choosing the finest unit that fits.
func grpcTimeout(d time.Duration) string {
	if d <= 0 {
		return "0n"
	}
	units := []struct {
		unit string
		size time.Duration
	}{{"n", time.Nanosecond}, {"u", time.Microsecond}, {"m", time.Millisecond}, {"S", time.Second}, {"M", time.Minute}, {"H", time.Hour}}
	for _, u := range units {
		v := (d + u.size - 1) / u.size
		if v < 100_000_000 {
			return strconv.FormatInt(int64(v), 10) + u.unit
		}
	}
	return "99999999H"
}

func (d *h2Driver) start(ctx context.Context) error {
	for i := 0; i < d.c.conns; i++ {
		n := d.c.concurrency / d.c.conns
		if i < d.c.concurrency%d.c.conns {
			n++
		}
		if n == 0 {
			continue
		}
		var dl net.Dialer
		nc, err := dl.DialContext(ctx, "tcp", d.c.addr)
		if err != nil {
			return fmt.Errorf("rlload: dial %s: %w", d.c.addr, err)
		}
		h := newH2Conn(d, nc, n, uint64(i))
		d.conns = append(d.conns, h)
		if err := h.handshake(); err != nil {
			return fmt.Errorf("rlload: HTTP/2 handshake with %s: %w", d.c.addr, err)
		}
	}
	for _, h := range d.conns {
		h.mu.Lock()
		now := time.Now()
		for i := range h.slots {
			h.issue(&h.slots[i], now)
		}
		h.mu.Unlock()
		h.signal()
		d.wg.Add(2)
		go h.readLoop()
		go h.writeLoop()
	}
	return nil
}

// stop lets the calls in flight finish (for at most --timeout, so the
// server sees no cancelled calls), then closes the connections.
func (d *h2Driver) stop() tally {
	for _, h := range d.conns {
		h.mu.Lock()
		h.draining = true
		h.mu.Unlock()
	}
	for deadline := time.Now().Add(d.c.timeout); d.busy() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(d.quit)
	for _, h := range d.conns {
		h.mu.Lock()
		h.closed = true // calls cut short by the shutdown are not errors
		h.mu.Unlock()
		_ = h.nc.Close()
	}
	d.wg.Wait()
	var all tally
	for _, h := range d.conns {
		all.add(h.tally)
	}
	return all
}

// allFailed is closed when every connection has failed.
func (d *h2Driver) allFailed() <-chan struct{} { return d.lost }

// busy reports whether a connection still has calls in flight or queued.
func (d *h2Driver) busy() bool {
	for _, h := range d.conns {
		h.mu.Lock()
		n := len(h.streams) + len(h.ready)
		closed := h.closed
		h.mu.Unlock()
		if n > 0 && !closed {
			return true
		}
	}
	return false
}
