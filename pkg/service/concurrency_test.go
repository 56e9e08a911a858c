package service_test

// Concurrency leases end to end with the descriptors envoy/website.yaml
// sends for /search (docs/algorithms/concurrency.md): the lease taken before
// the request, the release Envoy sends when the stream completes
// (apply_on_stream_done: true, same actions plus a trailing generic_key
// ratelimitd.release=1), and expiry when no release ever comes. Issue 4
// item 1.
//
// Units: search-in-flight in examples/website is 20 leases, unit second,
// unit_multiplier 30: a lease never released expires 30 s after it was
// taken.

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
)

// search is one GET /search from client through envoy/website.yaml.
type search struct {
	acquire []*rlcommon.RateLimitDescriptor // sent before the request
	release []*rlcommon.RateLimitDescriptor // sent when the stream completes
	lease   int                             // index of the in-flight descriptor in acquire
}

func websiteSearch(t *testing.T, client string) search {
	t.Helper()
	rt := envoyRoute(t, "../../envoy/website.yaml", "website", &replay.Request{
		Client: netip.MustParseAddr(client), Method: "GET", Path: "/search?q=envoy",
		Headers: map[string]string{"user-agent": "Mozilla/5.0"},
	})
	s := search{acquire: rlsDescriptors(rt.Descriptors), release: rlsDescriptors(rt.OnStreamDone), lease: -1}
	for i, d := range entriesOf(s.acquire) {
		if cmp.Equal(d, entryList("destination_cluster", "search")) {
			s.lease = i
		}
	}
	if s.lease < 0 {
		t.Fatalf("envoy/website.yaml sends no [destination_cluster=search] for /search: %v", entriesOf(s.acquire))
	}
	// The release is exactly the lease's entries plus ratelimitd.release=1.
	want := [][]policy.Entry{entryList("destination_cluster", "search", policy.ReleaseKey, "1")}
	if diff := cmp.Diff(want, entriesOf(s.release)); diff != "" {
		t.Fatalf("apply_on_stream_done descriptors (-want +got):\n%s", diff)
	}
	return s
}

// TestConcurrencyLeaseEnvoy: 20 searches in flight take the 20 leases; the
// 21st is denied by "search-in-flight"; Envoy's stream-done release of one
// search frees one lease; without releases every lease expires 30 s after
// it was taken (unit second × unit_multiplier 30).
func TestConcurrencyLeaseEnvoy(t *testing.T) {
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, "../../examples/website"))
	inFlight := limit("search-in-flight", 20, rlsv3.RateLimitResponse_RateLimit_SECOND)
	inFlight.UnitMultiplier = wrapperspb.UInt32(30)
	// One client per search (search-per-ip allows 10 a minute per client).
	client := func(i int) string { return fmt.Sprintf("192.0.2.%d", i) }

	leaseStatus := func(t *testing.T, step string, s search, resp *rlsv3.RateLimitResponse, want *rlsv3.RateLimitResponse_DescriptorStatus) {
		t.Helper()
		got := resp.GetStatuses()[s.lease]
		checkStatuses(t, step, &rlsv3.RateLimitResponse{OverallCode: want.GetCode(), Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{got}}, want.GetCode(), want)
	}

	// t0: 20 searches start; each takes a lease that ends 30 s later.
	var searches []search
	for i := 1; i <= 20; i++ {
		s := websiteSearch(t, client(i))
		searches = append(searches, s)
		resp := e.call(t, req("website", s.acquire...))
		if resp.GetOverallCode() != OK {
			t.Fatalf("search %d denied: %v", i, resp.GetStatuses())
		}
		leaseStatus(t, fmt.Sprint("search ", i), s, resp, st(OK, inFlight, uint32(20-i), 30*time.Second))
	}

	// The 21st search is denied by the in-flight limit alone.
	s21 := websiteSearch(t, client(21))
	resp := e.call(t, req("website", s21.acquire...))
	if resp.GetOverallCode() != OVER {
		t.Fatalf("21st search allowed: %v", resp.GetStatuses())
	}
	leaseStatus(t, "search 21", s21, resp, st(OVER, inFlight, 0, 30*time.Second))
	if got := problem(t, resp)["violated-policies"]; !cmp.Equal(got, []any{"search-in-flight"}) {
		t.Errorf("violated-policies %v, want [search-in-flight]", got)
	}
	// The leases expire on their own 30 s after t0: Retry-After 30.
	if h := headers(t, resp); h["Retry-After"] != "30" {
		t.Errorf("Retry-After %q, want 30", h["Retry-After"])
	}

	// 5 s later search 1 completes: Envoy sends its release. A release is
	// always allowed and reports the lease it returned.
	e.clock.Advance(5 * time.Second)
	rel := e.call(t, req("website", searches[0].release...))
	if rel.GetOverallCode() != OK || len(rel.GetStatuses()) != 1 || rel.GetStatuses()[0].GetCode() != OK {
		t.Fatalf("release: %v", rel)
	}
	// One lease is free: the 21st search now passes and holds the last one.
	resp = e.call(t, req("website", s21.acquire...))
	if resp.GetOverallCode() != OK {
		t.Fatalf("search after a release denied: %v", resp.GetStatuses())
	}
	leaseStatus(t, "search 21 after release", s21, resp, st(OK, inFlight, 0, 30*time.Second))
	// And the 22nd is denied again.
	s22 := websiteSearch(t, client(22))
	if resp := e.call(t, req("website", s22.acquire...)); resp.GetOverallCode() != OVER {
		t.Fatalf("22nd search allowed with 20 leases held: %v", resp.GetStatuses())
	}

	// No release ever comes for searches 2-20 (taken at t0) nor for search
	// 21 (taken at t0+5 s). At t0+29 s they are all still held.
	e.clock.Advance(24 * time.Second)
	if resp := e.call(t, req("website", s22.acquire...)); resp.GetOverallCode() != OVER {
		t.Fatalf("t0+29s: leases expired early: %v", resp.GetStatuses())
	}
	// At t0+30 s the 19 leases taken at t0 have expired: search 22 takes
	// one; 18 remain; search 21's lease (expires at t0+35 s) is still held.
	e.clock.Advance(time.Second)
	resp = e.call(t, req("website", s22.acquire...))
	if resp.GetOverallCode() != OK {
		t.Fatalf("t0+30s: expired leases still held: %v", resp.GetStatuses())
	}
	leaseStatus(t, "t0+30s", s22, resp, st(OK, inFlight, 18, 30*time.Second))
	// At t0+35 s search 21's lease has expired too.
	e.clock.Advance(5 * time.Second)
	resp = e.call(t, req("website", s21.acquire...))
	if resp.GetOverallCode() != OK {
		t.Fatalf("t0+35s: %v", resp.GetStatuses())
	}
	leaseStatus(t, "t0+35s", s21, resp, st(OK, inFlight, 18, 30*time.Second))
}
