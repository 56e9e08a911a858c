package service_test

import (
	"context"
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

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// useMemoryStore runs the handler tests on pkg/backend/memory instead of
// algotest.ReferenceStore (RATELIMITD_SERVICE_REFERENCE_STORE=0): the
// same decisions (the memory store passes the same conformance tables and
// agrees with algotest.Reference), through the real backend.
var useMemoryStore = os.Getenv("RATELIMITD_SERVICE_REFERENCE_STORE") == "0"

// t0 is 30 s into a minute (and 3570 s before the end of the hour).
var t0 = time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)

// clock is a settable test clock; renewals are the ticks of a Leaser's
// renewal loop on it (renewTicker).
type clock struct {
	mu       sync.Mutex
	now      time.Time
	renewals chan time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// faultStore is a service.Store in front of a store that decides
// (algotest.ReferenceStore, or pkg/backend/memory): it counts calls and,
// while fail has set an error, answers every Take with that error instead
// of asking the store. It never decides anything itself.
type faultStore struct {
	inner service.Store
	mu    sync.Mutex
	calls int
	err   error // when set, Take fails with it
}

// newReferenceStore is a faultStore over algotest.ReferenceStore on the
// test clock: the Store contract's executable definition.
func newReferenceStore(c *clock) *faultStore {
	return &faultStore{inner: algotest.NewReferenceStore(c.Now)}
}

// newMemoryStore is a faultStore over pkg/backend/memory on the test clock.
func newMemoryStore(t testing.TB, c *clock) *faultStore {
	t.Helper()
	m, err := memory.New(memory.Options{Now: c.Now, Shards: 4, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return &faultStore{inner: m}
}

// newStore is the store the handler tests decide with: newReferenceStore,
// or newMemoryStore with useMemoryStore.
func newStore(t testing.TB, c *clock) *faultStore {
	if useMemoryStore {
		return newMemoryStore(t, c)
	}
	return newReferenceStore(c)
}

func (f *faultStore) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	f.mu.Lock()
	f.calls++
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.inner.Take(ctx, hits, out)
}

// fail makes every later Take fail with err (nil: decide again).
func (f *faultStore) fail(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

// failing is fail(err) on f, returned for use in an expression.
func (f *faultStore) failing(err error) *faultStore { f.fail(err); return f }

func (f *faultStore) Calls() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

// causeErr is a backend error with a bounded cause.
type causeErr struct{ cause string }

func (e causeErr) Error() string { return "backend: " + e.cause }
func (e causeErr) Cause() string { return e.cause }

var errDown = causeErr{"refused"}

// callerDeadlineErr is a Store's timeout at the caller's deadline (or a
// budget derived from it): cause "timeout", errors.Is
// context.DeadlineExceeded, as the Redis store's ErrCallTimeout.
type callerDeadlineErr struct{}

func (callerDeadlineErr) Error() string { return "backend: no reply by the caller's deadline" }
func (callerDeadlineErr) Cause() string { return "timeout" }
func (callerDeadlineErr) Unwrap() error { return context.DeadlineExceeded }

var _ service.Causer = causeErr{}

// env is one service behind a bufconn gRPC server.
type env struct {
	svc      *service.Service
	store    *faultStore
	fallback *faultStore
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

// testOptions are the Options of the test services: store, metrics in
// reg, a discarding logger, the test clock c and a Rand of 0 (no retry
// jitter).
func testOptions(c *clock, store service.Store, reg *prometheus.Registry) service.Options {
	return service.Options{
		Store:      store,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: reg,
		Now:        c.Now,
		Rand:       func() float64 { return 0 },
	}
}

// newService is service.New(opts) after mutate (when not nil) has changed
// opts, failing t on an error.
func newService(t testing.TB, opts service.Options, mutate func(*service.Options)) *service.Service {
	t.Helper()
	if mutate != nil {
		mutate(&opts)
	}
	svc, err := service.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
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
	e := &env{clock: c, store: newStore(t, c), fallback: newStore(t, c), reg: prometheus.NewRegistry()}
	opts := testOptions(c, e.store, e.reg)
	opts.Fallback = e.fallback
	svc := newService(t, opts, mutate)
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

// newInProcess is a Service on st with default options, logs discarded
// and metrics on a fresh registry, reading the time from now (nil: the
// real clock), for decisions in process (no gRPC).
func newInProcess(tb testing.TB, st service.Store, now func() time.Time) *service.Service {
	tb.Helper()
	svc, err := service.New(service.Options{
		Store:      st,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
		Now:        now,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return svc
}

// d builds a descriptor from key, value pairs; withHits sets the
// descriptor-level hits_addend.
var (
	d        = testproc.Desc
	withHits = testproc.WithHits
)

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
