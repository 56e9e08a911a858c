package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/internal/listen"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// boundsService is a service on the memory store with one rule
// (domain "d", key "k": 1000 per minute) in force and the /json body bound
// of o, as serve wires it.
func boundsService(t testing.TB, o serveopts.Options) *service.Service {
	t.Helper()
	svc := newTestService(t, service.Options{Store: memoryStore(t), MaxJSONBodyBytes: o.GRPCMaxRecvMsgSize})
	setConfig(t, svc, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n")
	return svc
}

// boundsGRPC serves svc and a health server on a loopback gRPC server
// built as serve builds it (grpcLimits(o).ServerOptions(),
// listen.LimitConns), and returns a client connection to it.
func boundsGRPC(t testing.TB, o serveopts.Options, svc *service.Service, hs *health.Server) *grpc.ClientConn {
	t.Helper()
	return dialBounds(t, boundsServer(t, o, svc, hs))
}

func boundsServer(t testing.TB, o serveopts.Options, svc *service.Service, hs *health.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append([]grpc.ServerOption{svc.ServerOption()}, grpcLimits(o).ServerOptions()...)...)
	svc.Register(gs)
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(listen.LimitConns(ln, o.GRPCMaxConnections)) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

func dialBounds(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestGRPCMaxConnections: with --grpc-max-connections=1, a second client
// connection is not served (its call's deadline passes) until the first one
// closes.
func TestGRPCMaxConnections(t *testing.T) {
	o := serveopts.Defaults()
	o.GRPCMaxConnections = 1
	addr := boundsServer(t, o, boundsService(t, o), health.NewServer())
	first, second := dialBounds(t, addr), dialBounds(t, addr)
	check := func(cc *grpc.ClientConn, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(first, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := check(second, 300*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("second connection beyond the bound: %v; want DeadlineExceeded (not accepted)", err)
	}
	_ = first.Close()
	if err := check(second, 10*time.Second); err != nil {
		t.Fatalf("second connection after the first closed: %v", err)
	}
}

// bigRequest is a valid request for rule d/k whose wire form is about n
// bytes: descriptors of one entry k=<60 KiB value>.
func bigRequest(n int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "d"}
	v := strings.Repeat("v", 60<<10)
	for size := 0; size < n; size += len(v) {
		req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: v}},
		})
	}
	return req
}

// TestGRPCMaxRecvMsgSize: a message over --grpc-max-recv-msg-size fails
// with ResourceExhausted (it is not decoded); one under it is decided.
func TestGRPCMaxRecvMsgSize(t *testing.T) {
	o := serveopts.Defaults()
	o.GRPCMaxRecvMsgSize = 256 << 10
	cc := boundsGRPC(t, o, boundsService(t, o), health.NewServer())
	client := rlsv3.NewRateLimitServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := client.ShouldRateLimit(ctx, bigRequest(180<<10)) // 3 descriptors, ≈ 184 KiB
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request under the bound: %v, %v; want OK", resp.GetOverallCode(), err)
	}
	_, err = client.ShouldRateLimit(ctx, bigRequest(300<<10)) // 5 descriptors, ≈ 307 KiB
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("request over the bound: %v; want ResourceExhausted", err)
	}
	// The default is 1 MiB, well below grpc-go's 4 MiB.
	if d := serveopts.Defaults().GRPCMaxRecvMsgSize; d != 1<<20 {
		t.Errorf("default --grpc-max-recv-msg-size = %d, want 1 MiB", d)
	}
}

// TestGRPCMaxConcurrentStreams: a connection may hold
// --grpc-max-concurrent-streams streams: with 2 Watch streams open, a third
// call waits (its deadline passes) and goes through once one of them ends.
func TestGRPCMaxConcurrentStreams(t *testing.T) {
	o := serveopts.Defaults()
	o.GRPCMaxConcurrentStreams = 2
	hs := health.NewServer()
	cc := boundsGRPC(t, o, boundsService(t, o), hs)
	client := healthpb.NewHealthClient(cc)
	// Warm the connection so the server's SETTINGS (with the limit) are in.
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	var cancels []context.CancelFunc
	for range o.GRPCMaxConcurrentStreams {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		defer cancel()
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil { // the stream is open on the server
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call beyond the stream limit: %v; want DeadlineExceeded (waiting for a stream)", err)
	}
	cancels[0]()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("call after a stream ended: %v", err)
	}
}

// httpBounds serves h on loopback with httpLimits(o).Server(h, true).
func httpBounds(t *testing.T, o serveopts.Options, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := httpLimits(o).Server(h, true)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// closedByServer reports whether the server ends conn (EOF, reset, or a
// response followed by EOF) before the client's own 20 s deadline: far
// longer than the server timeouts of the tests, so only a server that
// never cuts the client reports false.
func closedByServer(conn net.Conn) bool {
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// TestHTTPSlowClientsCutOff: slow clients are disconnected by the HTTP
// timeouts: every one of 20 connections sending part of the headers, part
// of a body, or idling after a request is closed by the server.
func TestHTTPSlowClientsCutOff(t *testing.T) {
	o := serveopts.Defaults()
	o.HTTPReadTimeout = 200 * time.Millisecond
	o.HTTPIdleTimeout = 200 * time.Millisecond
	svc := boundsService(t, o)
	mux := http.NewServeMux()
	mux.Handle("/json", svc.JSONHandler())
	addr := httpBounds(t, o, mux)

	cases := map[string]func(net.Conn) error{
		"partial headers": func(c net.Conn) error {
			_, err := io.WriteString(c, "POST /json HTTP/1.1\r\nHost: x\r\n")
			return err
		},
		"partial body": func(c net.Conn) error {
			_, err := io.WriteString(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
			return err
		},
		"idle keep-alive": func(c net.Conn) error {
			body := `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
			if _, err := fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return err
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			_, err = io.Copy(io.Discard, resp.Body)
			return err
		},
	}
	for name, start := range cases {
		t.Run(name, func(t *testing.T) {
			const n = 20
			conns := make([]net.Conn, n)
			for i := range conns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = c.Close() }()
				if err := start(c); err != nil {
					t.Fatal(err)
				}
				conns[i] = c
			}
			closed := make(chan bool, n)
			for _, c := range conns {
				go func() { closed <- closedByServer(c) }()
			}
			cut := 0
			for range n {
				if <-closed {
					cut++
				}
			}
			if cut != n {
				t.Errorf("%d of %d slow connections closed by the server, want all", cut, n)
			}
		})
	}
}

// TestHTTPJSONBodyLimit: a /json body over the bound
// (--grpc-max-recv-msg-size) gets 413, whether its length is announced or
// chunked; one under it is decided.
func TestHTTPJSONBodyLimit(t *testing.T) {
	o := serveopts.Defaults()
	o.GRPCMaxRecvMsgSize = 4 << 10
	svc := boundsService(t, o)
	mux := http.NewServeMux()
	mux.Handle("/json", svc.JSONHandler())
	url := "http://" + httpBounds(t, o, mux) + "/json"
	body := func(valueLen int) string {
		return `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("v", valueLen) + `"}]}]}`
	}
	post := func(r io.Reader) int {
		t.Helper()
		resp, err := http.Post(url, "application/json", r)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if c := post(strings.NewReader(body(3 << 10))); c != http.StatusOK {
		t.Errorf("body under the bound: %d, want 200", c)
	}
	if c := post(strings.NewReader(body(5 << 10))); c != http.StatusRequestEntityTooLarge {
		t.Errorf("body over the bound (Content-Length): %d, want 413", c)
	}
	// io.MultiReader hides the length: the body is sent chunked.
	if c := post(io.MultiReader(strings.NewReader(body(5 << 10)))); c != http.StatusRequestEntityTooLarge {
		t.Errorf("body over the bound (chunked): %d, want 413", c)
	}
}

// TestBoundFlags: the resource-bound flags: defaults, flags, twins and
// validation.
func TestBoundFlags(t *testing.T) {
	d, _, err := serveopts.Parse(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.GRPCMaxRecvMsgSize != 1<<20 || d.GRPCMaxConcurrentStreams != 1000 || d.HTTPReadTimeout != 10*time.Second ||
		d.HTTPWriteTimeout != 10*time.Second || d.HTTPIdleTimeout != 2*time.Minute || d.GRPCMaxConnections != 0 {
		t.Errorf("defaults: %d %d %s %s %s", d.GRPCMaxRecvMsgSize, d.GRPCMaxConcurrentStreams, d.HTTPReadTimeout, d.HTTPWriteTimeout, d.HTTPIdleTimeout)
	}
	o, _, err := serveopts.Parse(nil, env("RATELIMITD_GRPC_MAX_RECV_MSG_SIZE", "65536", "RATELIMITD_GRPC_MAX_CONCURRENT_STREAMS", "10",
		"RATELIMITD_HTTP_READ_TIMEOUT", "1s", "RATELIMITD_HTTP_WRITE_TIMEOUT", "2s", "RATELIMITD_HTTP_IDLE_TIMEOUT", "3s", "RATELIMITD_GRPC_MAX_CONNECTIONS", "7"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.GRPCMaxRecvMsgSize != 65536 || o.GRPCMaxConcurrentStreams != 10 || o.HTTPReadTimeout != time.Second ||
		o.HTTPWriteTimeout != 2*time.Second || o.HTTPIdleTimeout != 3*time.Second || o.GRPCMaxConnections != 7 {
		t.Errorf("twins: %+v", o)
	}
	for _, bad := range []string{"--grpc-max-recv-msg-size=0", "--grpc-max-concurrent-streams=0", "--grpc-max-concurrent-streams=4294967296", "--grpc-max-connections=-1",
		"--http-read-timeout=0s", "--http-write-timeout=-1s", "--http-idle-timeout=0s"} {
		if _, _, err := serveopts.Parse([]string{bad}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(bad, "=", 2)[0]) {
			t.Errorf("%s: err %v", bad, err)
		}
	}
}

// rawCodec sends rawMsg bytes as they are (a request with invalid UTF-8,
// which proto.Marshal refuses to build) and decodes replies with proto.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMsg))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// hostileWire is the wire form of a request for domain "d" of 64
// descriptors of 32 entries whose values are valueLen bytes of invalid
// UTF-8 (0xff).
func hostileWire(valueLen int) []byte {
	v := bytes.Repeat([]byte{0xff}, valueLen)
	var desc []byte
	for range service.MaxEntries {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, "k")
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendBytes(e, v)
		desc = protowire.AppendTag(desc, 1, protowire.BytesType)
		desc = protowire.AppendBytes(desc, e)
	}
	var req []byte
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, "d")
	for range service.MaxDescriptors {
		req = protowire.AppendTag(req, 2, protowire.BytesType)
		req = protowire.AppendBytes(req, desc)
	}
	return req
}

// hostileCallBudget is the heap budget of one call of
// BenchmarkHostileInvalidUTF8Load, client side included: the 1 MB
// request as received, its decoded message (2.3 MB: escaped strings take
// 2 bytes per raw byte) and the scratch of decoding, of which only a few
// calls' are live at once.
const hostileCallBudget = 3 << 20

// hostileLoad sends rounds × 200 concurrent requests of 1 MB (just under
// the default --grpc-max-recv-msg-size) with invalid UTF-8 in all 64 x 32
// values, over 4 loopback connections, client and server in this process,
// and returns the peak Go heap in bytes, sampled every millisecond, and
// the bytes allocated per call. It fails tb when a call fails. next
// reports whether to run another round (b.Loop, or once for a test).
func hostileLoad(tb testing.TB, next func() bool) (peakHeap, allocPerCall uint64) {
	const calls, conns = 200, 4
	o := serveopts.Defaults()
	svc := boundsService(tb, o)
	wire := hostileWire(480)
	if len(wire) > o.GRPCMaxRecvMsgSize {
		tb.Fatalf("request of %d bytes is over the bound", len(wire))
	}
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i] = boundsGRPC(tb, o, svc, health.NewServer())
	}
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				metrics.Read(s)
				if v := s[0].Value.Uint64(); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	allocs := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(allocs)
	allocBefore := allocs[0].Value.Uint64()
	rounds := 0
	for next() {
		rounds++
		var wg sync.WaitGroup
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := &rlsv3.RateLimitResponse{}
				err := ccs[i%conns].Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
					rawMsg(wire), resp, grpc.ForceCodecV2(rawCodec{}))
				if err != nil {
					tb.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	close(stop)
	<-sampled
	metrics.Read(allocs)
	return peak.Load(), (allocs[0].Value.Uint64() - allocBefore) / uint64(max(rounds, 1)*calls)
}

// hostileAllocBudget bounds the bytes allocated per hostile call of
// hostileLoad, client side included: room for one decode, not for a
// decoder that copies the message at every nesting level.
const hostileAllocBudget = 10 << 20

// TestHostileInvalidUTF8Load: one round of hostileLoad allocates at most
// hostileAllocBudget per call. The peak heap depends on how many calls
// overlap, so the benchmark checks it, not the test.
func TestHostileInvalidUTF8Load(t *testing.T) {
	once := true
	peak, perCall := hostileLoad(t, func() bool { r := once; once = false; return r })
	t.Logf("peak heap %d MB, %.1f MB allocated per call", peak>>20, float64(perCall)/1e6)
	if perCall > hostileAllocBudget {
		t.Errorf("%d bytes allocated per 1 MB hostile call, over the budget of %d", perCall, hostileAllocBudget)
	}
}

// BenchmarkHostileInvalidUTF8Load runs hostileLoad and reports the peak Go
// heap and the process's peak RSS (VmHWM) in MB.
//
//	go test -run XXX -bench BenchmarkHostileInvalidUTF8Load -benchtime 3x ./cmd/ratelimitd/
func BenchmarkHostileInvalidUTF8Load(b *testing.B) {
	peak, perCall := hostileLoad(b, b.Loop)
	b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(perCall)/1e6, "alloc-MB/call")
	if budget := uint64(200 * hostileCallBudget); peak > budget {
		b.Errorf("peak heap %d MB for 200 concurrent hostile calls, over the budget of %d MB", peak>>20, budget>>20)
	}
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
				if kb, err := strconv.Atoi(f[1]); err == nil {
					b.ReportMetric(float64(kb)/1e3, "peak-RSS-MB")
				}
			}
		}
	}
}
