// The h2 driver's reader: frames in, response headers decoded, each
// call's outcome read from its grpc-status and RateLimitResponse.

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

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
