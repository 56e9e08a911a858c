package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// answer is what fakeRLS does for a key index.
type answer int

const (
	ansOK answer = iota
	ansOver
	ansError // grpc-status RESOURCE_EXHAUSTED
)

// fakeRLS is a RateLimitService whose answer depends only on the key index
// of the descriptor value "user-<i>", so every client must count the same.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rule  func(i int) answer
	calls atomic.Int64
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.calls.Add(1)
	if r.GetDomain() != "bench" || len(r.GetDescriptors()) != 1 || len(r.GetDescriptors()[0].GetEntries()) != 1 {
		return nil, status.Error(codes.InvalidArgument, "unexpected request shape")
	}
	e := r.GetDescriptors()[0].GetEntries()[0]
	v, ok := strings.CutPrefix(e.GetValue(), "user-")
	i, err := strconv.Atoi(v)
	if e.GetKey() != "user" || !ok || err != nil {
		return nil, status.Error(codes.InvalidArgument, "unexpected descriptor entry")
	}
	// Extra fields around overall_code, as ratelimitd answers carry them.
	resp := &rlsv3.RateLimitResponse{
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:           rlsv3.RateLimitResponse_OK,
			LimitRemaining: 7,
		}},
		ResponseHeadersToAdd: []*commonv3.HeaderValue{{Key: "ratelimit", Value: `"default";r=7;t=1`}},
	}
	switch f.rule(i) {
	case ansOver:
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	case ansError:
		return nil, status.Error(codes.ResourceExhausted, "boom")
	default:
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	return resp, nil
}

// serve starts a gRPC server for rls on a loopback port and returns its
// address.
func serve(t *testing.T, rls rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, rls)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

func testConfig(addr, client string, requests int64, keys, concurrency, conns int) config {
	return config{addr: addr, client: client, domain: "bench", key: "user", keys: keys, concurrency: concurrency,
		conns: conns, requests: requests, timeout: 5 * time.Second}
}

// expect counts what rule gives for calls 0..n-1 on keys j mod keys.
func expect(rule func(int) answer, n int64, keys int) (ok, over, errs int64) {
	for j := int64(0); j < n; j++ {
		switch rule(int(j % int64(keys))) {
		case ansOK:
			ok++
		case ansOver:
			over++
		default:
			errs++
		}
	}
	return ok, over, errs
}

func checkCounts(t *testing.T, r Result, ok, over, errs int64) {
	t.Helper()
	if r.OK != ok || r.OverLimit != over || r.Errors != errs || r.Decisions != ok+over {
		t.Errorf("--client %s: ok %d, over_limit %d, errors %d, decisions %d; want %d, %d, %d, %d",
			r.Client, r.OK, r.OverLimit, r.Errors, r.Decisions, ok, over, errs, ok+over)
	}
}

func TestClientsCountExactly(t *testing.T) {
	rule := func(i int) answer {
		switch i % 4 {
		case 1:
			return ansOver
		case 2:
			return ansError
		}
		return ansOK
	}
	for _, tc := range []struct {
		name                     string
		requests                 int64
		keys, concurrency, conns int
		opts                     []grpc.ServerOption
	}{
		// 4000 requests of ~20 bytes exceed the default 65535-byte
		// connection send window: the server's WINDOW_UPDATEs must be used.
		{name: "uneven spread", requests: 4000, keys: 101, concurrency: 10, conns: 3},
		// More callers than the server's MAX_CONCURRENT_STREAMS: calls queue.
		{name: "max concurrent streams", requests: 500, keys: 10, concurrency: 20, conns: 1,
			opts: []grpc.ServerOption{grpc.MaxConcurrentStreams(3)}},
		{name: "more conns than callers", requests: 50, keys: 7, concurrency: 2, conns: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRLS{rule: rule}
			addr := serve(t, f, tc.opts...)
			ok, over, errs := expect(rule, tc.requests, tc.keys)
			for _, client := range []string{"h2", "grpc"} {
				before := f.calls.Load()
				r, err := run(context.Background(), testConfig(addr, client, tc.requests, tc.keys, tc.concurrency, tc.conns))
				if err != nil {
					t.Fatalf("--client %s: %v", client, err)
				}
				checkCounts(t, r, ok, over, errs)
				if got := f.calls.Load() - before; got != tc.requests {
					t.Errorf("--client %s: server saw %d calls, want %d", client, got, tc.requests)
				}
				if r.ClientCPUPerDecisionUS <= 0 || r.CPUPerDecisionUS != -1 || r.P50US <= 0 || r.P99US < r.P50US {
					t.Errorf("--client %s: implausible result %+v", client, r)
				}
			}
		})
	}
}

// serveStalling starts an HTTP/2 (h2c, net/http) gRPC server that
// answers OK, except for keys where stall(i) holds: those get no answer
// until the client resets the stream or the test ends. Unlike grpc-go, the
// net/http server does not enforce grpc-timeout, so only the client's own
// timeout ends the stalled calls.
func serveStalling(t *testing.T, stall func(i int) bool) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	ok := responseFrame(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req rlsv3.RateLimitRequest
		if err != nil || len(body) < 5 || proto.Unmarshal(body[5:], &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		v, _ := strings.CutPrefix(req.GetDescriptors()[0].GetEntries()[0].GetValue(), "user-")
		if i, _ := strconv.Atoi(v); stall(i) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(ok)
		w.Header().Set("Grpc-Status", "0")
	})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true) // prior knowledge, as Envoy and rlload speak
	srv := &http.Server{Handler: h, Protocols: &protos, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		close(release)
		_ = srv.Close()
		<-done
	})
	return lis.Addr().String()
}

func TestTimeouts(t *testing.T) {
	stall := func(i int) bool { return i%25 == 3 }
	addr := serveStalling(t, stall)
	const requests, keys = 300, 100
	var errs int64
	for j := range int64(requests) {
		if stall(int(j % keys)) {
			errs++
		}
	}
	for _, client := range []string{"h2", "grpc"} {
		c := testConfig(addr, client, requests, keys, 8, 2)
		// Generous, so that no answered call times out on a loaded host
		// (the count below is exact); only the stalled calls reach it.
		c.timeout = 2 * time.Second
		r, err := run(context.Background(), c)
		if err != nil {
			t.Fatalf("--client %s: %v", client, err)
		}
		checkCounts(t, r, requests-errs, 0, errs)
	}
}

// startRatelimitd runs the real service (memory store, clock pinned) with
// testdata/limits.yaml and the service's own codec, as cmd/ratelimitd does.
func startRatelimitd(t *testing.T) string {
	t.Helper()
	now := func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }
	st, err := memory.New(memory.Options{Now: now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	svc, err := service.New(service.Options{Store: st, Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := policy.Load(policy.LoadOptions{}, "testdata/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
	return serve(t, svc, svc.ServerOption())
}

func TestClientsAgreeOnRatelimitd(t *testing.T) {
	const requests, keys, perKey = 1000, 100, 3 // 10 calls per key, 3 allowed
	for _, client := range []string{"h2", "grpc"} {
		addr := startRatelimitd(t) // fresh counters for each client
		r, err := run(context.Background(), testConfig(addr, client, requests, keys, 16, 2))
		if err != nil {
			t.Fatalf("--client %s: %v", client, err)
		}
		checkCounts(t, r, keys*perKey, requests-keys*perKey, 0)
	}
}

func TestH2DurationMode(t *testing.T) {
	addr := serve(t, &fakeRLS{rule: func(i int) answer { return answer(i % 2) }})
	c := testConfig(addr, "h2", 0, 1000, 8, 2)
	c.duration, c.warmup = 300*time.Millisecond, 50*time.Millisecond
	r, err := run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.OK == 0 || r.OverLimit == 0 || int64(r.PerSecond) <= 0 {
		t.Errorf("duration run: %+v; want OK and OVER_LIMIT answers, no errors", r)
	}
}

func TestRunRejectsUnknownClient(t *testing.T) {
	if _, err := run(context.Background(), testConfig("127.0.0.1:1", "http3", 1, 1, 1, 1)); err == nil {
		t.Fatal("--client http3: want error")
	}
}

func TestGRPCTimeout(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0n"},
		{time.Nanosecond, "1n"},
		{99999999 * time.Nanosecond, "99999999n"},
		{100 * time.Millisecond, "100000u"},
		{time.Second, "1000000u"},
		{200 * time.Second, "200000m"},
		{1500 * time.Microsecond, "1500000n"},
		{1000 * time.Hour, "3600000S"},
		{30000 * time.Hour, "1800000M"},
	} {
		if got := grpcTimeout(tc.d); got != tc.want {
			t.Errorf("grpcTimeout(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func responseFrame(t testing.TB, r *rlsv3.RateLimitResponse) []byte {
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return grpcFrame(b)
}

func TestOverallCode(t *testing.T) {
	full := &rlsv3.RateLimitResponse{
		OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 3}},
		ResponseHeadersToAdd: []*commonv3.HeaderValue{{Key: "retry-after", Value: "1"}},
		RawBody:              []byte("{}"),
	}
	good := responseFrame(t, full)
	compressed := append([]byte{1}, good[1:]...)
	for _, tc := range []struct {
		name   string
		in     []byte
		code   int32
		wantOK bool
	}{
		{"over limit with other fields", good, overLimitCode, true},
		{"ok", responseFrame(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}), 1, true},
		{"empty message", grpcFrame(nil), 0, true},
		{"compressed", compressed, 0, false},
		{"short prefix", good[:4], 0, false},
		{"length mismatch", good[:len(good)-1], 0, false},
		{"bad wire", grpcFrame([]byte{0x08}), 0, false},
	} {
		code, ok := overallCode(tc.in)
		if code != tc.code || ok != tc.wantOK {
			t.Errorf("%s: overallCode = %d, %v; want %d, %v", tc.name, code, ok, tc.code, tc.wantOK)
		}
	}
}

// FuzzOverallCode checks overallCode against proto.Unmarshal: whatever
// protobuf accepts, overallCode accepts with the same overall_code.
func FuzzOverallCode(f *testing.F) {
	f.Add([]byte{0x08, 0x02})
	f.Add([]byte{0x08, 0x01, 0x12, 0x02, 0x08, 0x01})
	f.Add([]byte{0x0a, 0x00, 0x08, 0x02})
	f.Fuzz(func(t *testing.T, msg []byte) {
		var r rlsv3.RateLimitResponse
		code, ok := overallCode(grpcFrame(msg))
		if err := proto.Unmarshal(msg, &r); err == nil {
			if !ok || code != int32(r.GetOverallCode()) {
				t.Fatalf("overallCode(%x) = %d, %v; proto says %d", msg, code, ok, r.GetOverallCode())
			}
		}
	})
}

// BenchmarkOverallCode compares the protowire scan with a full
// proto.Unmarshal of a ratelimitd-like answer.
func BenchmarkOverallCode(b *testing.B) {
	msg := responseFrame(b, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 999}},
		ResponseHeadersToAdd: []*commonv3.HeaderValue{
			{Key: "ratelimit-policy", Value: `"default";q=1000;w=1`}, {Key: "ratelimit", Value: `"default";r=999;t=1`}},
	})
	b.Run("protowire", func(b *testing.B) {
		for b.Loop() {
			if _, ok := overallCode(msg); !ok {
				b.Fatal("bad")
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var r rlsv3.RateLimitResponse
			if err := proto.Unmarshal(msg[5:], &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestHeaderBlock checks that the replayed header block decodes to the
// request headers, that it is kept once made of indexed fields only, and
// that it is dropped and not kept when the server forbids a dynamic table.
func TestHeaderBlock(t *testing.T) {
	d, err := newH2Driver(testConfig("rls.example:8081", "h2", 1, 1, 1, 1), newLoad(config{keys: 1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tableSize := range []int{-1, 0} {
		h := newH2Conn(d, nil, 1, 0)
		dec := hpack.NewDecoder(4096, nil)
		for i := range 4 {
			if tableSize >= 0 && i == 2 {
				h.henc.SetMaxDynamicTableSizeLimit(uint32(tableSize))
				h.hblock = nil
			}
			got, err := dec.DecodeFull(h.headerBlock())
			if err != nil {
				t.Fatalf("table %d, request %d: %v", tableSize, i, err)
			}
			if !slices.Equal(got, d.hdrs) {
				t.Fatalf("table %d, request %d: decoded %v, want %v", tableSize, i, got, d.hdrs)
			}
			kept := h.hblock != nil
			if want := i >= 1 && (tableSize < 0 || i < 2); kept != want {
				t.Errorf("table %d, request %d: block kept = %v, want %v", tableSize, i, kept, want)
			}
		}
	}
}

// TestH2ServerGoesAway checks that a --requests run ends (with errors for
// the calls it could not make) when the server stops mid-run, instead of
// waiting for answers that cannot come.
func TestH2ServerGoesAway(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRLS{rule: func(int) answer { return ansOK }}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	go func() { // the server goes away mid-run, after 100 calls (30 s at most)
		for deadline := time.Now().Add(30 * time.Second); f.calls.Load() < 100 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		g.Stop()
	}()
	const requests = 100_000_000
	r, err := run(context.Background(), testConfig(lis.Addr().String(), "h2", requests, 10, 8, 2))
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if r.OK == 0 || r.OK > f.calls.Load() || r.Errors == 0 || r.OK+r.Errors >= requests {
		t.Errorf("server stopped after %d calls: %+v; want some OK (at most that many), then errors, and the run over early",
			f.calls.Load(), r)
	}
}
