package redise2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed background dial; the outages here are
	// deliberate.
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// loadSet writes each YAML document to its own file of a temporary
// directory (one domain per file) and loads the directory with policy.Load.
func loadSet(t testing.TB, yamls ...string) *policy.Set {
	t.Helper()
	dir := t.TempDir()
	for i, y := range yamls {
		p := filepath.Join(dir, "config"+strconv.Itoa(i)+".yaml")
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	set, _, err := policy.Load(policy.LoadOptions{}, dir)
	if err != nil {
		t.Fatalf("policy.Load: %v", err)
	}
	return set
}

// instance is one service instance: its own Service, Redis Store (own
// go-redis client and pool), memory fallback and metrics registry.
type instance struct {
	svc   *service.Service
	store *redis.Store
	reg   *prometheus.Registry
}

// newMemory is a memory store with default Options, closed when t ends.
func newMemory(t testing.TB) *memory.Store {
	t.Helper()
	m, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// newStore builds a redis.Store from opts and closes it when t ends.
func newStore(t testing.TB, opts redis.Options) *redis.Store {
	t.Helper()
	st, err := redis.New(opts)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if opts.LocalCacheSize > 0 { // Warm waits for the cache's credit subscription
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := st.Warm(ctx); err != nil {
			t.Fatalf("Warm: %v", err)
		}
	}
	return st
}

// newInstance starts a service over a new redis.Store built from opts, with
// a memory fallback, serving set.
func newInstance(t testing.TB, opts redis.Options, set *policy.Set) *instance {
	t.Helper()
	st := newStore(t, opts)
	svc, reg := newService(t, service.Options{Store: st, Fallback: newMemory(t)}, set)
	return &instance{svc: svc, store: st, reg: reg}
}

// newService is service.New(o) with a new metrics registry (returned)
// and a discarding logger, serving set; an error fails t.
func newService(t testing.TB, o service.Options, set *policy.Set) (*service.Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := service.New(o)
	if err != nil {
		t.Fatalf("service.New: %v", err)
	}
	svc.SetPolicy(set)
	return svc, reg
}

// standaloneOpts are DefaultOptions for a standalone server URL.
func standaloneOpts(url string) redis.Options {
	o := redis.DefaultOptions()
	o.URL = url
	return o
}

// exactTimeout replaces DefaultTimeout (10 ms) in the exactness tests. They
// prove atomicity across instances, which needs Redis to decide every
// call; a burst that must dial new pool connections can exceed 10 ms on
// a busy machine, and such a call is then (correctly) decided by the
// rule's failure mode instead. The latency budget itself is
// tested by the failure-mode tests with the default options.
const exactTimeout = 2 * time.Second

// generous returns o with Timeout exactTimeout.
func generous(o redis.Options) redis.Options {
	o.Timeout = exactTimeout
	return o
}

// req builds a request of domain with one descriptor per entry list; each
// list is key, value, key, value, ...
func req(domain string, descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: domain}
	for _, kv := range descs {
		d := &rlcommon.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// call runs ShouldRateLimit and fails the test on an error (backend
// failures are never errors: the failure modes decide).
func call(t testing.TB, in *instance, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := in.svc.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func isOK(r *rlsv3.RateLimitResponse) bool {
	return r.GetOverallCode() == rlsv3.RateLimitResponse_OK
}

// header returns the first response_headers_to_add value named name.
func header(r *rlsv3.RateLimitResponse, name string) string {
	for _, h := range r.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// problemType returns the RFC 9457 "type" of the raw_body, "" when none.
func problemType(t testing.TB, r *rlsv3.RateLimitResponse) string {
	t.Helper()
	if len(r.GetRawBody()) == 0 {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(r.GetRawBody(), &p); err != nil {
		t.Fatalf("raw_body is not JSON: %v: %q", err, r.GetRawBody())
	}
	return p.Type
}

// counter sums the counter samples of family name whose labels include
// every pair of want.
func counter(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	v, err := testproc.MetricSum(reg, name, want)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// causes returns ratelimitd_backend_errors_total by cause (non-zero only).
func causes(t testing.TB, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimitd_backend_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "cause" && m.GetCounter().GetValue() > 0 {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// latencies summarises call durations.
type latencies []time.Duration

func (l latencies) pct(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func (l latencies) String() string {
	return "n=" + strconv.Itoa(len(l)) + " p50=" + l.pct(0.5).String() + " p99=" + l.pct(0.99).String() + " max=" + l.pct(1).String()
}

// waitFor polls cond every 5 ms until it holds or timeout passes and
// returns the time it took; it fails the test on timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// toEntries turns key, value, ... into policy entries.
func toEntries(kv ...string) []policy.Entry {
	var out []policy.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, policy.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// warmBound bounds warm's wait for a Take that Redis decides.
const warmBound = 20 * time.Second

// warm makes each instance's Store take a hit on a key no test uses (a
// call on the Store, so no rule of the test's set and no service metric
// is involved), so that the script is loaded and connections are dialed
// before a measured burst. With the default 10 ms Timeout the first Take
// (a dial and SCRIPT LOAD) can time out, which is what warming is for:
// it retries until a Take succeeds, and fails t if none did within
// warmBound.
func warm(t testing.TB, ins []*instance) {
	t.Helper()
	hit := []algo.Hit{{Key: "redise2e:warm", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}, Cost: 1}}
	for i, in := range ins {
		var err error
		start := time.Now()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = algotest.Take(ctx, in.store, hit)
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > warmBound {
				t.Fatalf("instance %d: no warm-up Take succeeded within %v: %v", i, warmBound, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
