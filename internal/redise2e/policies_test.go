package redise2e

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// policiesConfig exercises the address and capacity options of a rule
// with the descriptors Envoy sends: remote_address (an address) and
// masked_remote_address (a prefix such as 192.168.1.0/24). Every window
// is an hour; awayFromHourBoundary keeps the calls of a test inside one.
const policiesConfig = `
domain: policies
descriptors:
  # CIDR values: exact value, then the most specific prefix, then the
  # value-less default.
  - key: remote_address
    value: 10.0.0.0/8
    rate_limit: {unit: hour, requests_per_unit: 6}
  - key: remote_address
    value: 10.1.0.0/16
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: remote_address
    value: 10.1.2.3
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: remote_address
    ipv6_prefix: 64
    cgnat: {multiplier: 10, ranges: [100.64.0.0/10]}
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: masked_remote_address
    value: 192.168.0.0/16
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: masked_remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  # Reserved capacity on one shared limit per route.
  - key: route
    reserve: {entry: priority, value: critical, share: 0.8}
    rate_limits:
      - {unit: hour, requests_per_unit: 10}
  - key: leases
    reserve: {entry: priority, value: critical, share: 0.5}
    rate_limit: {unit: hour, requests_per_unit: 8, algorithm: concurrency}
  - key: logged
    reserve: {entry: priority, value: critical, share: 0.8}
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}
  # A global cap per route over per-key limits (docs/abuse.md).
  - key: scrape_route
    value: search
    rate_limit: {name: search-total, unit: hour, requests_per_unit: 300}
    descriptors:
      - key: client
        rate_limit: {name: search-per-client, unit: hour, requests_per_unit: 5}
`

// policyBackends serves policiesConfig on the memory store (one
// instance) and on a fresh Redis (two instances, each with its own
// client, sharing the counters), with logs written to the returned
// buffers.
func policyBackends(t *testing.T) (backends map[string][]*instance, logs map[string]*syncBuffer) {
	t.Helper()
	set := loadSet(t, policiesConfig)
	logs = map[string]*syncBuffer{"memory": {}, "redis": {}}
	withLog := func(name string, o service.Options) *instance {
		reg := prometheus.NewRegistry()
		o.Registerer = reg
		o.Logger = slog.New(slog.NewTextHandler(logs[name], nil))
		svc, err := service.New(o)
		if err != nil {
			t.Fatalf("service.New: %v", err)
		}
		svc.SetPolicy(set)
		return &instance{svc: svc, reg: reg}
	}
	mem := withLog("memory", service.Options{Store: newMemory(t)})
	srv := redistest.Standalone(t)
	var rs []*instance
	for range 2 {
		st := newStore(t, patient(standaloneOpts(srv.URL())))
		in := withLog("redis", service.Options{Store: st, Fallback: newMemory(t)})
		in.store = st
		rs = append(rs, in)
	}
	warm(t, rs)
	return map[string][]*instance{"memory": {mem}, "redis": rs}, logs
}

// patient returns o with a Timeout of 10 s. These tests count what is
// admitted, which needs Redis to decide every call; under -race a burst
// of calls that must dial the pool and load the script can exceed
// exactTimeout, and a call that times out is (rightly)
// left to the failure mode. The latency budget is the failure-mode tests'
// subject.
func patient(o redis.Options) redis.Options {
	o.Timeout = 10 * time.Second
	return o
}

// syncBuffer is a log destination that goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// admitted sends n calls of r one after another to the instances in
// turn and counts the admitted ones.
func admitted(t *testing.T, ins []*instance, n int, r func(i int) *rlsv3.RateLimitRequest) int {
	t.Helper()
	ok := 0
	for i := range n {
		if isOK(call(t, ins[i%len(ins)], r(i))) {
			ok++
		}
	}
	return ok
}

// TestPoliciesAddressTable: per value Envoy's actions send, how many of
// 20 sequential calls each store admits. Values of one group share one
// counter (the calls rotate through them).
func TestPoliciesAddressTable(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, _ := policyBackends(t)
	cases := []struct {
		name   string
		key    string
		values []string
		want   int
	}{
		{"exact value beats prefixes, in every spelling", "remote_address", []string{"10.1.2.3", "::ffff:10.1.2.3", "::FFFF:10.1.2.3"}, 2},
		{"most specific prefix", "remote_address", []string{"10.1.9.9"}, 9},
		{"an address inside a prefix and its mapped form share", "remote_address", []string{"10.1.9.8", "::ffff:10.1.9.8", "::ffff:a01:908"}, 9},
		{"prefix; each address its own counter", "remote_address", []string{"10.9.0.1"}, 6},
		{"IPv4 outside every prefix", "remote_address", []string{"192.0.2.1"}, 4},
		{"IPv4 and its mapped IPv6 form share", "remote_address", []string{"192.0.2.2", "::ffff:192.0.2.2"}, 4},
		{"one IPv6 /64 rotating addresses", "remote_address", []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:aaaa::3", "2001:db8:1:2::/64"}, 4},
		{"another /64", "remote_address", []string{"2001:db8:1:3::1"}, 4},
		{"CGNAT address: raised 10x", "remote_address", []string{"100.64.7.1"}, 40},
		{"CGNAT mapped IPv6 shares the raised counter", "remote_address", []string{"100.64.7.2", "::ffff:100.64.7.2"}, 40},
		{"masked_remote_address inside a prefix", "masked_remote_address", []string{"192.168.1.0/24"}, 7},
		{"masked_remote_address outside", "masked_remote_address", []string{"172.16.1.0/24"}, 3},
	}
	for name, ins := range backends {
		for _, c := range cases {
			got := admitted(t, ins, c.want+10, func(i int) *rlsv3.RateLimitRequest {
				return req("policies", []string{c.key, c.values[i%len(c.values)]})
			})
			if got != c.want {
				t.Errorf("%s: %s: %d admitted, want %d", name, c.name, got, c.want)
			}
		}
	}
}

// TestPoliciesIPv6RotationConcurrent: 400 concurrent calls from one IPv6
// /64, each from a different address, and 400 from one CGNAT address,
// admit exactly the /64's limit and the raised limit.
func TestPoliciesIPv6RotationConcurrent(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, _ := policyBackends(t)
	for name, ins := range backends {
		ok, over := concurrentCalls(t, ins, 400, func(i int) *rlsv3.RateLimitRequest {
			return req("policies", []string{"remote_address", fmt.Sprintf("2001:db8:77:1:%x::%x", i, i+1)})
		})
		if ok != 4 || over != 396 {
			t.Errorf("%s: one /64 from 400 addresses: %d admitted, %d denied; want 4, 396", name, ok, over)
		}
		ok, over = concurrentCalls(t, ins, 400, func(int) *rlsv3.RateLimitRequest {
			return req("policies", []string{"remote_address", "100.100.0.9"})
		})
		if ok != 40 || over != 360 {
			t.Errorf("%s: one CGNAT address: %d admitted, %d denied; want 40, 360", name, ok, over)
		}
	}
}

// TestPoliciesCGNATLog: the cgnat decision is counted for every
// descriptor, logged at most once per second with the number of lines
// left out, and never with the address.
func TestPoliciesCGNATLog(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, logs := policyBackends(t)
	for name, ins := range backends {
		n := admitted(t, ins, 30, func(int) *rlsv3.RateLimitRequest {
			return req("policies", []string{"remote_address", "100.64.200.17"})
		})
		if n != 30 {
			t.Fatalf("%s: %d of 30 admitted, want 30", name, n)
		}
		var raised float64
		for _, in := range ins {
			raised += counter(t, in.reg, "ratelimitd_cgnat_raised_total", map[string]string{"domain": "policies", "rule": "policies.remote_address"})
		}
		if raised != 30 {
			t.Errorf("%s: ratelimitd_cgnat_raised_total = %g, want 30", name, raised)
		}
		out := logs[name].String()
		lines := strings.Count(out, `msg="cgnat raised limit"`)
		// One line per instance per second at most: the calls take far
		// less than the test's run, so at most a few lines each.
		if lines < 1 || lines > len(ins)*3 {
			t.Errorf("%s: %d cgnat log lines for 30 decisions, want 1..%d:\n%s", name, lines, len(ins)*3, out)
		}
		if strings.Contains(out, "100.64.200.17") {
			t.Errorf("%s: the log holds the raw address:\n%s", name, out)
		}
		if !strings.Contains(out, "multiplier=10") || !strings.Contains(out, "key=") {
			t.Errorf("%s: the log line lacks multiplier or key:\n%s", name, out)
		}
	}
}

// TestPoliciesReserveTable: other requests stop at floor(0.8 × 10) = 8
// and are shed with temporary-reduced-capacity; critical ones use the
// last 2; then critical ones are denied as quota-exceeded. On a
// concurrency limit (share 0.5 of 8) the same, counted in leases.
func TestPoliciesReserveTable(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, _ := policyBackends(t)
	type step struct {
		priority string // "" sends no priority entry
		ok       bool
		problem  string // problem type suffix of a denial
	}
	seq := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	for _, key := range []string{"route", "logged"} {
		var steps []step
		steps = append(steps, seq(4, step{"", true, ""})...)
		steps = append(steps, seq(4, step{"low", true, ""})...)
		steps = append(steps, step{"", false, "temporary-reduced-capacity"}, step{"low", false, "temporary-reduced-capacity"})
		steps = append(steps, seq(2, step{"critical", true, ""})...)
		steps = append(steps, step{"critical", false, "quota-exceeded"}, step{"", false, "temporary-reduced-capacity"})
		for name, ins := range backends {
			for i, s := range steps {
				entries := []string{key, "/checkout"}
				if s.priority != "" {
					entries = append(entries, "priority", s.priority)
				}
				resp := call(t, ins[i%len(ins)], req("policies", entries))
				if isOK(resp) != s.ok {
					t.Fatalf("%s: %s step %d (priority %q): OK = %t, want %t", name, key, i, s.priority, isOK(resp), s.ok)
				}
				// Each request is told the quota it is decided against.
				q := ";q=8;"
				if s.priority == "critical" {
					q = ";q=10;"
				}
				if p := header(resp, "RateLimit-Policy"); !strings.Contains(p, q) {
					t.Errorf("%s: %s step %d: RateLimit-Policy %q, want %s", name, key, i, p, q)
				}
				if !s.ok {
					if got := problemType(t, resp); !strings.HasSuffix(got, s.problem) {
						t.Errorf("%s: %s step %d: problem type %q, want …%s", name, key, i, got, s.problem)
					}
					if header(resp, "Retry-After") == "" {
						t.Errorf("%s: %s step %d: a 429 without Retry-After", name, key, i)
					}
				}
			}
			var shed float64
			for _, in := range ins {
				shed += counter(t, in.reg, "ratelimitd_reserve_shed_total", map[string]string{"domain": "policies", "rule": "policies." + key})
			}
			if shed != 3 {
				t.Errorf("%s: %s: ratelimitd_reserve_shed_total = %g, want 3", name, key, shed)
			}
		}
	}
	for name, ins := range backends {
		lease := func(p string) bool {
			return isOK(call(t, ins[0], req("policies", []string{"leases", "a", "priority", p})))
		}
		got := []bool{lease("low"), lease("low"), lease("low"), lease("low"), lease("low"), lease("critical"), lease("critical"), lease("critical"), lease("critical"), lease("critical")}
		want := []bool{true, true, true, true, false, true, true, true, true, false}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: leases %v, want %v", name, got, want)
		}
	}
}

// TestPoliciesReserveConcurrent: 300 concurrent calls on one limit of 10
// (share 0.8), a third of them critical: exactly 10 are admitted, at most
// 8 of them not critical (on memcached, at most 10).
func TestPoliciesReserveConcurrent(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, _ := policyBackends(t)
	backends["memcache"] = memcacheInstance(t)
	for name, ins := range backends {
		var mu sync.Mutex
		var critical, other int
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 300 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				p := "low"
				if i%3 == 0 {
					p = "critical"
				}
				resp := call(t, ins[i%len(ins)], req("policies", []string{"route", "/pay", "priority", p}))
				if !isOK(resp) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if p == "critical" {
					critical++
				} else {
					other++
				}
			}()
		}
		close(start)
		wg.Wait()
		if name == "memcache" {
			// memcached counts with incr, then decr when denied: a
			// concurrent denied incr can make another request see the
			// counter above its value and deny it too. Never more.
			if critical+other > 10 || other > 8 || critical+other == 0 {
				t.Errorf("%s: admitted %d critical and %d other; want at most 10 in all, at most 8 other", name, critical, other)
			}
			continue
		}
		if critical+other != 10 || other > 8 {
			t.Errorf("%s: admitted %d critical and %d other; want 10 in all, at most 8 other", name, critical, other)
		}
	}
}

// TestPoliciesGlobalCapStopsDistributedScrape: 500 clients each send 2
// calls, under their per-client limit of 5, from 128 goroutines; the
// identity-free cap of the route admits exactly 300 of the 1000.
func TestPoliciesGlobalCapStopsDistributedScrape(t *testing.T) {
	redistest.Require(t)
	awayFromHourBoundary(t)
	backends, _ := policyBackends(t)
	backends["memcache"] = memcacheInstance(t)
	for name, ins := range backends {
		ok, over := pooledCalls(t, ins, 1000, 128, func(i int) *rlsv3.RateLimitRequest {
			return req("policies",
				[]string{"scrape_route", "search"},
				[]string{"scrape_route", "search", "client", fmt.Sprintf("c%03d", i%500)})
		})
		if ok != 300 || over != 700 {
			t.Errorf("%s: %d admitted, %d denied; want 300, 700", name, ok, over)
		}
		// Without the cap descriptor, every client is under its own limit.
		ok, _ = pooledCalls(t, ins, 1000, 128, func(i int) *rlsv3.RateLimitRequest {
			return req("policies", []string{"scrape_route", "search", "client", fmt.Sprintf("d%03d", i%500)})
		})
		if ok != 1000 {
			t.Errorf("%s: per-client limits alone admitted %d of 1000, want all", name, ok)
		}
	}
}

// TestPoliciesExamplesGlobalCap: examples/policies as shipped. 800
// addresses each send 4 searches at once, far under the per-address limit
// of 30; the identity-free search cap admits exactly 3000 of the 3200.
// 64 goroutines send them (3200 at once would only measure how the
// scheduler queues them); they take well under the 20 s left in the minute.
func TestPoliciesExamplesGlobalCap(t *testing.T) {
	redistest.Require(t)
	awayFromMinuteBoundary(t)
	set, _, err := policy.Load(policy.LoadOptions{}, "../../examples/policies")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Standalone(t)
	backends := map[string][]*instance{}
	svc, reg := newService(t, service.Options{Store: newMemory(t)}, set)
	backends["memory"] = []*instance{{svc: svc, reg: reg}}
	for range 2 {
		backends["redis"] = append(backends["redis"], newInstance(t, patient(standaloneOpts(srv.URL())), set))
	}
	warm(t, backends["redis"])
	for name, ins := range backends {
		ok, over := pooledCalls(t, ins, 3200, 64, func(i int) *rlsv3.RateLimitRequest {
			addr := fmt.Sprintf("203.0.%d.%d", (i%800)/200, (i%800)%200+1)
			return req("edge", []string{"route", "search"}, []string{"route", "search", "remote_address", addr})
		})
		if ok != 3000 || over != 200 {
			t.Errorf("%s: %d admitted, %d denied; want 3000, 200", name, ok, over)
		}
	}
}

// awayFromMinuteBoundary waits until at least 20 s remain in the current
// minute (at most 20 s).
func awayFromMinuteBoundary(t testing.TB) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < 20*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
}

// pooledCalls sends n calls of r from workers goroutines, call i to
// instance i%len(ins), and counts OK and OVER_LIMIT answers; any error
// fails t.
func pooledCalls(t *testing.T, ins []*instance, n, workers int, r func(i int) *rlsv3.RateLimitRequest) (ok, over int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := ins[i%len(ins)].svc.ShouldRateLimit(ctx, r(i))
				cancel()
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					ok++
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					over++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			t.Fatalf("ShouldRateLimit: %v", err)
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("ShouldRateLimit: %v", err)
	default:
	}
	return ok, over
}

// memcacheInstance serves policiesConfig on a memcached store (fixed
// windows only: the tests that use it touch fixed_window rules only).
func memcacheInstance(t *testing.T) []*instance {
	t.Helper()
	srv := memcachetest.Start(t)
	o := memcache.DefaultOptions()
	o.Addrs = []string{srv.Addr()}
	o.Timeout = 10 * time.Second
	st, err := memcache.New(o)
	if err != nil {
		t.Fatalf("memcache.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	svc, reg := newService(t, service.Options{Store: st}, loadSet(t, policiesConfig))
	return []*instance{{svc: svc, reg: reg}}
}
