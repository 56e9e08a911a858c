package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
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

// h2Slot is one call in flight (or queued for the writer) and the state of
// its answer.
type h2Slot struct {
	key   int
	start time.Time // when the call was issued
	id    uint32    // stream identifier, 0 while queued
	// answer
	httpOK     bool   // :status 200 seen
	grpcStatus int    // grpc-status, -1 until seen
	rst        bool   // RST_STREAM received
	tooBig     bool   // message over maxResponse
	buf        []byte // DATA payload (gRPC length-prefixed message)
}

// h2Conn is one HTTP/2 connection. Fields under mu are shared by the reader
// and the writer; the others belong to one of them as marked.
type h2Conn struct {
	d    *h2Driver
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	fr   *http2.Framer
	wake chan struct{}

	// writer only
	henc   *hpack.Encoder
	hbuf   bytes.Buffer
	hblock []byte // header block made only of indexed fields, replayable as is

	// reader only
	hdec    *hpack.Decoder
	hcur    *h2Slot // stream whose header block is being decoded (nil: unknown stream)
	hcurID  uint32  // its stream identifier
	hend    bool    // that HEADERS frame had END_STREAM
	recvd   uint32  // DATA bytes consumed since the last connection WINDOW_UPDATE
	pending bool    // the writer has work the reader has not signalled yet

	mu             sync.Mutex
	rng            *rand.Rand
	slots          []h2Slot
	ready          []*h2Slot          // calls issued, waiting for a stream
	streams        map[uint32]*h2Slot // open streams
	nextID         uint32
	peerMaxStreams uint32 // SETTINGS_MAX_CONCURRENT_STREAMS
	peerInitWindow int64  // SETTINGS_INITIAL_WINDOW_SIZE (per-stream send credit)
	peerTableSize  uint32 // SETTINGS_HEADER_TABLE_SIZE
	tableChanged   bool
	sendWindow     int64 // connection send credit
	pings          [][8]byte
	settingsAcks   int
	windowUpdate   uint32 // connection WINDOW_UPDATE increment to send
	rsts           []uint32
	goaway         bool // no new streams (GOAWAY received or stream ids exhausted)
	closed         bool // connection failed or driver stopped
	draining       bool // driver stopping: no new calls
	tally          tally
}

func newH2Conn(d *h2Driver, nc net.Conn, slots int, seed uint64) *h2Conn {
	h := &h2Conn{
		d:              d,
		nc:             nc,
		br:             bufio.NewReaderSize(nc, 64<<10),
		bw:             bufio.NewWriterSize(nc, 64<<10),
		wake:           make(chan struct{}, 1),
		rng:            rand.New(rand.NewPCG(seed, 42)),
		slots:          make([]h2Slot, slots),
		streams:        make(map[uint32]*h2Slot, slots),
		nextID:         1,
		peerMaxStreams: ^uint32(0),
		peerInitWindow: h2DefaultWindow,
		sendWindow:     h2DefaultWindow,
		tally:          tally{lat: make([]time.Duration, 0, 1<<16)},
	}
	h.fr = http2.NewFramer(h.bw, h.br)
	h.fr.SetReuseFrames()
	h.henc = hpack.NewEncoder(&h.hbuf)
	h.hdec = hpack.NewDecoder(4096, h.emit)
	h.hdec.SetMaxStringLength(16 << 10)
	return h
}

// handshake sends the client connection preface, SETTINGS and the
// connection WINDOW_UPDATE, then reads the server's SETTINGS (the first
// frame of its preface) so MAX_CONCURRENT_STREAMS is known before any
// stream opens.
func (h *h2Conn) handshake() error {
	if _, err := h.bw.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	if err := h.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2Window},
	); err != nil {
		return err
	}
	if err := h.fr.WriteWindowUpdate(0, h2Window-h2DefaultWindow); err != nil {
		return err
	}
	if err := h.bw.Flush(); err != nil {
		return err
	}
	_ = h.nc.SetReadDeadline(time.Now().Add(h.d.c.timeout + 5*time.Second))
	f, err := h.fr.ReadFrame()
	_ = h.nc.SetReadDeadline(time.Time{})
	if err != nil {
		return err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return fmt.Errorf("first frame from the server is %v, want SETTINGS", f.Header())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applySettings(sf)
}

// applySettings records the server's SETTINGS and queues their ACK. Called
// with mu held.
func (h *h2Conn) applySettings(f *http2.SettingsFrame) error {
	err := f.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			h.peerMaxStreams = s.Val
		case http2.SettingInitialWindowSize:
			if s.Val > maxStreamID {
				return errors.New("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
			}
			h.peerInitWindow = int64(s.Val)
		case http2.SettingHeaderTableSize:
			h.peerTableSize, h.tableChanged = s.Val, true
		}
		return nil
	})
	h.settingsAcks++
	return err
}

// signal wakes the writer (without blocking; one pending wake is enough).
func (h *h2Conn) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// issue starts slot s's next call, if the run wants one, queueing it for
// the writer. Called with mu held.
func (h *h2Conn) issue(s *h2Slot, now time.Time) {
	if h.goaway || h.closed || h.draining {
		return
	}
	k, ok := h.d.ld.next(h.rng)
	if !ok {
		return
	}
	s.key, s.start, s.id = k, now, 0
	h.ready = append(h.ready, s)
}

// record counts the outcome of slot s's call (when measuring) and marks the
// call complete. Called with mu held.
func (h *h2Conn) record(s *h2Slot, now time.Time, failed bool) {
	if h.d.ld.measuring.Load() {
		h.tally.lat = append(h.tally.lat, now.Sub(s.start))
		switch {
		case failed:
			h.tally.errs++
		default:
			code, ok := overallCode(s.buf)
			switch {
			case !ok:
				h.tally.errs++
			case code == overLimitCode:
				h.tally.over++
			default:
				h.tally.ok++
			}
		}
	}
	h.d.ld.complete()
}

// finish ends the stream of slot s: records its answer and issues the
// slot's next call. Called with mu held.
func (h *h2Conn) finish(s *h2Slot, now time.Time) {
	delete(h.streams, s.id)
	failed := s.rst || s.tooBig || !s.httpOK || s.grpcStatus != 0
	h.record(s, now, failed)
	h.issue(s, now)
}

// overallCode decodes RateLimitResponse.overall_code (field 1, varint) from
// a gRPC length-prefixed message; false when the message is compressed,
// truncated or not valid protobuf wire format.
func overallCode(b []byte) (int32, bool) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		return 0, false
	}
	m := b[5:]
	var code int32
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return 0, false
		}
		m = m[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(m)
			if n < 0 {
				return 0, false
			}
			code, m = int32(v), m[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, m)
		if n < 0 {
			return 0, false
		}
		m = m[n:]
	}
	return code, true
}

// emit receives each decoded header field of the current header block.
func (h *h2Conn) emit(f hpack.HeaderField) {
	s := h.hcur
	if s == nil {
		return
	}
	switch f.Name {
	case ":status":
		s.httpOK = f.Value == "200"
	case "grpc-status":
		n, err := strconv.Atoi(f.Value)
		if err != nil || n < 0 {
			n = 2 // UNKNOWN
		}
		s.grpcStatus = n
	}
}

// frameBuffered reports whether a whole frame is already buffered, so the
// reader can process it without blocking (and the writer's wake-up can wait
// for the batch to be complete).
func (h *h2Conn) frameBuffered() bool {
	n := h.br.Buffered()
	if n < 9 {
		return false
	}
	p, _ := h.br.Peek(9)
	return n >= 9+(int(p[0])<<16|int(p[1])<<8|int(p[2]))
}

func (h *h2Conn) readLoop() {
	defer h.d.wg.Done()
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				h.mu.Lock()
				if s := h.streams[se.StreamID]; s != nil {
					s.rst = true
					h.finish(s, time.Now())
				}
				h.rsts = append(h.rsts, se.StreamID)
				h.mu.Unlock()
				h.pending = true
			} else {
				h.fail(err)
				return
			}
		} else if err := h.onFrame(f); err != nil {
			h.fail(err)
			return
		}
		if h.pending && !h.frameBuffered() {
			h.pending = false
			h.signal()
		}
	}
}

// onFrame handles one frame from the server.
func (h *h2Conn) onFrame(f http2.Frame) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch f := f.(type) {
	case *http2.HeadersFrame:
		h.hcur, h.hcurID, h.hend = h.streams[f.StreamID], f.StreamID, f.StreamEnded()
		return h.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		if h.hcur != nil && h.streams[h.hcurID] != h.hcur { // given up meanwhile
			h.hcur = nil
		}
		return h.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		h.recvd += f.Length
		if h.recvd >= h2Window/2 {
			h.windowUpdate += h.recvd
			h.recvd = 0
			h.pending = true
		}
		s := h.streams[f.StreamID]
		if s == nil {
			return nil
		}
		if len(s.buf)+len(f.Data()) > maxResponse {
			s.tooBig = true
		} else {
			s.buf = append(s.buf, f.Data()...)
		}
		if f.StreamEnded() { // no trailers: no grpc-status, an error
			s.grpcStatus = -1
			h.finish(s, time.Now())
			h.pending = true
		}
	case *http2.RSTStreamFrame:
		if s := h.streams[f.StreamID]; s != nil {
			s.rst = true
			h.finish(s, time.Now())
			h.pending = true
		}
	case *http2.SettingsFrame:
		if !f.IsAck() {
			h.pending = true
			return h.applySettings(f)
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			h.pings = append(h.pings, f.Data)
			h.pending = true
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			h.sendWindow += int64(f.Increment)
			h.pending = len(h.ready) > 0 || h.pending
		}
	case *http2.GoAwayFrame:
		h.goaway = true
		now := time.Now()
		for id, s := range h.streams {
			if id > f.LastStreamID { // never processed by the server
				delete(h.streams, id)
				h.record(s, now, true)
			}
		}
		h.pending = true
	}
	return nil
}

// onHeaderBlock decodes a HEADERS or CONTINUATION fragment (always, so the
// HPACK dynamic table stays in step even for streams already given up) and,
// at the end of a block with END_STREAM, ends the stream. Called with mu
// held.
func (h *h2Conn) onHeaderBlock(frag []byte, ended bool) error {
	if _, err := h.hdec.Write(frag); err != nil {
		return fmt.Errorf("rlload: HPACK: %w", err)
	}
	if !ended {
		return nil
	}
	if err := h.hdec.Close(); err != nil {
		return fmt.Errorf("rlload: HPACK: %w", err)
	}
	if s := h.hcur; s != nil && h.hend {
		h.finish(s, time.Now())
		h.pending = true
	}
	h.hcur = nil
	return nil
}

// fail ends the connection after a read or write error: every call in
// flight or queued on it counts as an error (unless the driver is
// stopping) and its slots stop.
func (h *h2Conn) fail(err error) {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		now := time.Now()
		for id, s := range h.streams {
			delete(h.streams, id)
			h.record(s, now, true)
		}
		for _, s := range h.ready {
			h.record(s, now, true)
		}
		h.ready = h.ready[:0]
		_ = err // the counts carry it; a run with errors says so
		if int(h.d.failed.Add(1)) == len(h.d.conns) {
			close(h.d.lost)
		}
	}
	h.mu.Unlock()
	_ = h.nc.Close()
	h.signal()
}

type h2Out struct {
	id  uint32
	key int
}

func (h *h2Conn) writeLoop() {
	defer h.d.wg.Done()
	every := max(min(h.d.c.timeout/4, 250*time.Millisecond), time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var (
		out   []h2Out
		pings [][8]byte
		rsts  []uint32
	)
	for {
		sweep := false
		select {
		case <-h.wake:
		case <-tick.C:
			sweep = true
		case <-h.d.quit:
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		if sweep {
			h.sweep(time.Now())
		}
		pings = append(pings[:0], h.pings...)
		h.pings = h.pings[:0]
		rsts = append(rsts[:0], h.rsts...)
		h.rsts = h.rsts[:0]
		acks, upd := h.settingsAcks, h.windowUpdate
		h.settingsAcks, h.windowUpdate = 0, 0
		if h.tableChanged {
			h.henc.SetMaxDynamicTableSizeLimit(h.peerTableSize)
			h.tableChanged, h.hblock = false, nil
		}
		out = h.openStreams(out[:0])
		h.mu.Unlock()

		var err error
		for _, p := range pings {
			err = errors.Join(err, h.fr.WritePing(true, p))
		}
		for ; acks > 0; acks-- {
			err = errors.Join(err, h.fr.WriteSettingsAck())
		}
		if upd > 0 {
			err = errors.Join(err, h.fr.WriteWindowUpdate(0, upd))
		}
		for _, id := range rsts {
			err = errors.Join(err, h.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}
		for _, o := range out {
			err = errors.Join(err,
				h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: o.id, BlockFragment: h.headerBlock(), EndHeaders: true}),
				h.fr.WriteData(o.id, true, h.d.msgs[o.key]))
		}
		if err == nil {
			err = h.bw.Flush()
		}
		if err != nil {
			h.fail(err)
			return
		}
	}
}

// openStreams gives queued calls stream identifiers while the server's
// MAX_CONCURRENT_STREAMS and the send windows allow, appending them to out.
// Called with mu held.
func (h *h2Conn) openStreams(out []h2Out) []h2Out {
	now := time.Now()
	i := 0
	for ; i < len(h.ready); i++ {
		s := h.ready[i]
		n := int64(len(h.d.msgs[s.key]))
		if h.goaway || h.nextID > maxStreamID || n > h.peerInitWindow {
			// The call cannot be sent on this connection: an error.
			h.goaway = true
			h.record(s, now, true)
			continue
		}
		if uint32(len(h.streams)) >= h.peerMaxStreams || n > h.sendWindow {
			break
		}
		h.sendWindow -= n
		s.id = h.nextID
		h.nextID += 2
		s.httpOK, s.grpcStatus, s.rst, s.tooBig, s.buf = false, -1, false, false, s.buf[:0]
		h.streams[s.id] = s
		out = append(out, h2Out{id: s.id, key: s.key})
	}
	h.ready = append(h.ready[:0], h.ready[i:]...)
	return out
}

// sweep gives up on calls older than --timeout: each counts as an error,
// its stream is reset (RST_STREAM CANCEL) and the slot's next call is
// issued. Called with mu held.
func (h *h2Conn) sweep(now time.Time) {
	for id, s := range h.streams {
		if now.Sub(s.start) > h.d.c.timeout {
			delete(h.streams, id)
			h.rsts = append(h.rsts, id)
			h.record(s, now, true)
			h.issue(s, now)
		}
	}
}

// headerBlock HPACK-encodes the request headers with the dynamic table:
// the first request adds them to it, later ones refer to them by index.
// Once a block is made only of one-byte indexed fields (RFC 7541 §6.1,
// which leave the dynamic table unchanged) it is kept and replayed as is,
// until the server changes SETTINGS_HEADER_TABLE_SIZE. The result is valid
// until the next call.
func (h *h2Conn) headerBlock() []byte {
	if h.hblock != nil {
		return h.hblock
	}
	h.hbuf.Reset()
	for _, f := range h.d.hdrs {
		_ = h.henc.WriteField(f)
	}
	b := h.hbuf.Bytes()
	if len(b) == len(h.d.hdrs) && !slices.ContainsFunc(b, func(c byte) bool { return c&0x80 == 0 || c == 0xff }) {
		h.hblock = slices.Clone(b)
	}
	return b
}
