// One HTTP/2 connection of the h2 driver: its slots, streams and the
// lifecycle of each call (issue, record, time out).

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

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
