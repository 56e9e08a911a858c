package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rssBytes is the resident set size of process pid (VmRSS).
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// floodConn is a raw HTTP/2 client connection that opens ShouldRateLimit
// streams and never sends their request message: each stream stays open on
// the server until the connection closes.
type floodConn struct {
	conn    net.Conn
	fr      *http2.Framer
	wmu     sync.Mutex
	refused atomic.Int64 // RST_STREAM REFUSED_STREAM received
	maxConc atomic.Int64 // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	goaway  atomic.Bool
}

func dialFlood(t *testing.T, addr string) *floodConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	f := &floodConn{conn: c, fr: http2.NewFramer(c, c)}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := f.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go f.read()
	return f
}

// read answers the server's SETTINGS and PINGs and counts refusals.
func (f *floodConn) read() {
	for {
		fr, err := f.fr.ReadFrame()
		if err != nil {
			return
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				if v, ok := fr.Value(http2.SettingMaxConcurrentStreams); ok {
					f.maxConc.Store(int64(v))
				}
				f.wmu.Lock()
				_ = f.fr.WriteSettingsAck()
				f.wmu.Unlock()
			}
		case *http2.PingFrame:
			if !fr.IsAck() {
				f.wmu.Lock()
				_ = f.fr.WritePing(true, fr.Data)
				f.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			if fr.ErrCode == http2.ErrCodeRefusedStream {
				f.refused.Add(1)
			}
		case *http2.GoAwayFrame:
			f.goaway.Store(true)
		}
	}
}

// open sends n request headers without END_STREAM, on new stream IDs,
// ignoring the server's stream limit as an attacker would.
func (f *floodConn) open(t *testing.T, authority string, n int) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", authority},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	block := hb.Bytes()
	f.wmu.Lock()
	defer f.wmu.Unlock()
	for i := 0; i < n; i++ {
		id := uint32(2*i + 1)
		if err := f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatalf("HEADERS on stream %d: %v", id, err)
		}
	}
}

// TestStreamFloodBounded: clients that open streams and never send their
// request, beyond the advertised limit, hold at most
// --grpc-max-concurrent-streams streams per connection: every stream beyond
// it is refused (RST_STREAM REFUSED_STREAM), the service keeps deciding for
// a well-behaved client, and the process's RSS grows by at most the stated
// budget of 24 MiB per flooding connection at the default limit of 1000
// (docs/security.md, "Resource bounds").
func TestStreamFloodBounded(t *testing.T) {
	const (
		conns     = 8
		perConn   = 3000
		limit     = 1000
		budgetPer = 24 << 20
	)
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(oneFile, 1000000))
	p := start(t, startOpts{args: []string{"--config", dir}})
	cc := p.dial(t)
	p.waitServing(t, cc, "")
	for i := 0; i < 200; i++ {
		call(t, cc, "e2e", desc("k", "warm"))
	}
	before := rssBytes(t, p.Cmd.Process.Pid)

	floods := make([]*floodConn, conns)
	for i := range floods {
		floods[i] = dialFlood(t, p.grpc)
		floods[i].open(t, p.grpc, perConn)
	}
	eventually(t, 60*time.Second, func() string {
		for i, f := range floods {
			if got := f.refused.Load(); got < perConn-limit {
				return fmt.Sprintf("connection %d: %d of %d streams refused, want at least %d (server limit %d, goaway %v)",
					i, got, perConn, perConn-limit, f.maxConc.Load(), f.goaway.Load())
			}
		}
		return ""
	})
	for i, f := range floods {
		if got := f.maxConc.Load(); got != limit {
			t.Errorf("connection %d: server advertised SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", i, got, limit)
		}
		if got := f.refused.Load(); got != perConn-limit {
			t.Errorf("connection %d: %d streams refused, want exactly %d (the server holds %d)", i, got, perConn-limit, limit)
		}
	}
	// The service still decides for others while the flood holds its
	// streams.
	if resp := call(t, cc, "e2e", desc("k", "during-flood")); resp.GetStatuses()[0].GetLimitRemaining() != 999999 {
		t.Errorf("decision during the flood: %v", resp)
	}
	after := rssBytes(t, p.Cmd.Process.Pid)
	grew := after - before
	budget := int64(conns * budgetPer)
	if raceEnabled {
		// The race detector keeps shadow memory for every goroutine stack
		// and heap object, several times a held stream's own
		// (BENCHMARKS.md, "Hostile requests").
		budget *= 4
	}
	t.Logf("RSS %d MiB before, %d MiB with %d connections × %d held streams (%.1f KiB per stream)",
		before>>20, after>>20, conns, limit, float64(grew)/float64(conns*limit)/1024)
	if grew > budget {
		t.Errorf("RSS grew by %d MiB for %d flooding connections, over the budget of %d MiB (race detector: %v)", grew>>20, conns, budget>>20, raceEnabled)
	}
}
