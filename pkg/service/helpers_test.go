package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// useReferenceStore runs the handler tests on the in-test reference store
// instead of pkg/backend/memory (RATELIMITD_SERVICE_REFERENCE_STORE=1), to
// tell a service bug from a backend bug.
var useReferenceStore = os.Getenv("RATELIMITD_SERVICE_REFERENCE_STORE") == "1"

// t0 is 30 s into a minute (and 3570 s before the end of the hour).
var t0 = time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// fakeStore counts calls and injects errors in front of a real store:
// the memory backend (inner) when set, else the reference implementation
// of the service.Store contract (algotest.Reference: a denied request
// consumes nothing but its releases and always_charge hits; hits that did
// not deny report the value before).
type fakeStore struct {
	mu    sync.Mutex
	clock *clock
	inner service.Store
	state map[string]algo.State
	calls int
	err   error // when set, Take fails with it
}

func newFakeStore(c *clock) *fakeStore { return &fakeStore{clock: c, state: map[string]algo.State{}} }

// newMemoryStore is a fakeStore over pkg/backend/memory on the test clock.
func newMemoryStore(t testing.TB, c *clock) *fakeStore {
	t.Helper()
	m, err := memory.New(memory.Options{Now: c.Now, Shards: 4, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	f := newFakeStore(c)
	f.inner = m
	return f
}

func (f *fakeStore) Take(ctx context.Context, hits []algo.Hit) ([]algo.Decision, error) {
	f.mu.Lock()
	f.calls++
	err, inner := f.err, f.inner
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if inner != nil {
		return inner.Take(ctx, hits)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return algotest.Reference(f.state, hits, f.clock.Now()), nil
}

func (f *fakeStore) fail(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

func (f *fakeStore) Calls() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

// causeErr is a backend error with a bounded cause.
type causeErr struct{ cause string }

func (e causeErr) Error() string { return "backend: " + e.cause }
func (e causeErr) Cause() string { return e.cause }

var errDown = causeErr{"refused"}

var _ service.Causer = causeErr{}
var _ = errors.New

// env is one service behind a bufconn gRPC server.
type env struct {
	svc      *service.Service
	store    *fakeStore
	fallback *fakeStore
	clock    *clock
	reg      *prometheus.Registry
	client   rlsv3.RateLimitServiceClient
	conn     *grpc.ClientConn
}

func loadSet(t testing.TB, paths ...string) *policy.Set {
	t.Helper()
	if len(paths) == 0 {
		paths = []string{"testdata/service.yaml"}
	}
	set, _, err := policy.Load(policy.LoadOptions{}, paths...)
	if err != nil {
		t.Fatalf("load %v: %v", paths, err)
	}
	return set
}

func newEnv(t testing.TB, mutate func(*service.Options)) *env {
	t.Helper()
	return startEnv(t, false, mutate)
}

// startEnv is newEnv with, when withCodec, the service's own gRPC server
// codec (Service.ServerOption) installed, as cmd/ratelimitd does.
func startEnv(t testing.TB, withCodec bool, mutate func(*service.Options)) *env {
	t.Helper()
	c := &clock{now: t0}
	e := &env{clock: c, store: newMemoryStore(t, c), fallback: newMemoryStore(t, c), reg: prometheus.NewRegistry()}
	if useReferenceStore {
		e.store, e.fallback = newFakeStore(c), newFakeStore(c)
	}
	opts := service.Options{
		Store:      e.store,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Fallback:   e.fallback,
		Registerer: e.reg,
		Now:        c.Now,
		Rand:       func() float64 { return 0 },
	}
	if mutate != nil {
		mutate(&opts)
	}
	svc, err := service.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(loadSet(t))
	e.svc = svc

	lis := bufconn.Listen(1 << 20)
	var gopts []grpc.ServerOption
	if withCodec {
		gopts = append(gopts, svc.ServerOption())
	}
	g := grpc.NewServer(gopts...)
	svc.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
	})
	e.conn = conn
	e.client = rlsv3.NewRateLimitServiceClient(conn)
	return e
}

// d builds a descriptor from key, value pairs.
func d(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// withHits sets the descriptor-level hits_addend.
func withHits(x *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	x.HitsAddend = wrapperspb.UInt64(n)
	return x
}

func req(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (e *env) call(t testing.TB, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.client.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// headers returns response_headers_to_add as a map (last value wins) and
// fails on duplicates.
func headers(t testing.TB, resp *rlsv3.RateLimitResponse) map[string]string {
	t.Helper()
	h := map[string]string{}
	for _, hv := range resp.GetResponseHeadersToAdd() {
		if _, dup := h[hv.GetKey()]; dup {
			t.Errorf("header %s twice", hv.GetKey())
		}
		h[hv.GetKey()] = hv.GetValue()
	}
	return h
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
