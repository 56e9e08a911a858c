// The h2 driver's writer: new streams (HPACK headers and one gRPC
// message each), window updates, ping and SETTINGS acks and stream
// resets, one flush per wake-up.

package main

import (
	"errors"
	"slices"
	"time"

	"golang.org/x/net/http2"
)

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
