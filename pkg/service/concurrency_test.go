package service_test

// Concurrency leases end to end with the descriptors envoy/website.yaml
// sends for /search (docs/algorithms/concurrency.md): the lease taken before
// the request, the release Envoy sends when the stream of an admitted search
// completes (apply_on_stream_done: true, same actions plus a trailing
// ratelimitd.release entry taken from the x-ratelimitd-lease header that a
// header_mutation filter after the rate-limit filter adds), no release for a
// search Envoy denied, and expiry when no release ever comes.
//
// Units: search-in-flight in examples/website is 20 leases, unit second,
// unit_multiplier 30: a lease never released expires 30 s after it was
// taken.

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
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
	release []*rlcommon.RateLimitDescriptor // sent when the stream of an admitted search completes
	denied  []*rlcommon.RateLimitDescriptor // sent when Envoy denied it (429) and the stream completes
	lease   int                             // index of the in-flight descriptor in acquire
}

func websiteSearch(t *testing.T, client string) search {
	t.Helper()
	rt := envoyRoute(t, "../../envoy/website.yaml", "website", &replay.Request{
		Client: netip.MustParseAddr(client), Method: "GET", Path: "/search?q=envoy",
		Headers: map[string]string{"user-agent": "Mozilla/5.0"},
	})
	s := search{acquire: rlsDescriptors(rt.Descriptors), release: rlsDescriptors(rt.OnStreamDone),
		denied: rlsDescriptors(rt.OnStreamDoneDenied), lease: -1}
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
	// The gate: no release when Envoy answered 429 itself.
	if len(s.denied) != 0 {
		t.Fatalf("apply_on_stream_done descriptors of a denied search: %v", entriesOf(s.denied))
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

// TestConcurrencyReleaseOnlyWhenAdmitted: with envoy/website.yaml's gated
// release (docs/algorithms/concurrency.md), 40 searches arriving while the
// first ones are in flight leave exactly 20 leases held (the denied 20 send
// no release), and releasing the 20 admitted ones lets 20 more in.
func TestConcurrencyReleaseOnlyWhenAdmitted(t *testing.T) {
	e := newEnv(t, nil)
	// examples/website: destination_cluster=search holds search-in-flight
	// (20 leases, 30 s).
	e.svc.SetPolicy(loadSet(t, "../../examples/website"))

	// start runs one search through Envoy: the rate-limit call, then, when
	// it completes, the stream-done descriptors of an admitted or a denied
	// request (pkg/replay simulates the header_mutation filters).
	start := func(client string) (admitted bool, done []*rlcommon.RateLimitDescriptor) {
		s := websiteSearch(t, client)
		admitted = e.call(t, req("website", s.acquire...)).GetOverallCode() == OK
		if admitted {
			return true, s.release
		}
		return false, s.denied
	}
	end := func(done []*rlcommon.RateLimitDescriptor) {
		if len(done) > 0 {
			if resp := e.call(t, req("website", done...)); resp.GetOverallCode() != OK {
				t.Fatalf("release denied: %v", resp.GetStatuses())
			}
		}
	}

	var inFlight [][]*rlcommon.RateLimitDescriptor
	for i := 1; i <= 40; i++ {
		ok, done := start(fmt.Sprintf("192.0.2.%d", i))
		if !ok {
			if len(done) != 0 {
				t.Fatalf("search %d: denied, yet Envoy would send a release: %v", i, entriesOf(done))
			}
			end(done) // a denied request completes at once (429)
			continue
		}
		inFlight = append(inFlight, done)
	}
	if len(inFlight) != 20 {
		t.Fatalf("%d searches in flight, want 20 (the limit)", len(inFlight))
	}
	for _, done := range inFlight {
		end(done)
	}
	for i := 41; i <= 60; i++ {
		if ok, _ := start(fmt.Sprintf("192.0.2.%d", i)); !ok {
			t.Fatalf("search %d denied after 20 releases", i)
		}
	}
	if ok, _ := start("192.0.2.61"); ok {
		t.Fatal("a 21st lease was granted")
	}
}

// TestConcurrencyUngatedReleaseExactLeases: with an unconditional release
// (the release entry from a generic_key, the form TestLeaseReleaseGated
// refuses in every shipped Envoy file), Envoy also releases after its own
// 429, and the service cannot tell that release from a real one. It still
// keeps exact lease accounting, checked at every call against a model: a
// lease is granted only while fewer than 20 are held, a denied search takes
// none, and each release returns exactly one held lease. The searches in
// flight then exceed the leases held: the misconfiguration's cost, and why
// the release is gated (docs/algorithms/concurrency.md).
func TestConcurrencyUngatedReleaseExactLeases(t *testing.T) {
	gated, err := os.ReadFile("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ungated := strings.Replace(string(gated), `                                  - request_headers:
                                      header_name: x-ratelimitd-lease
                                      descriptor_key: ratelimitd.release`,
		`                                  - generic_key: {descriptor_key: ratelimitd.release, descriptor_value: "1"}`, 1)
	if ungated == string(gated) {
		t.Fatal("envoy/website.yaml: the gated release was not found")
	}
	b, err := replay.DecodeBootstrap([]byte(ungated))
	if err != nil {
		t.Fatal(err)
	}
	en, err := replay.NewEnvoy(b)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, "../../examples/website"))
	const leases = 20                         // search-in-flight
	at := websiteSearch(t, "192.0.2.1").lease // the lease's status, as in the gated file
	held, foreign := 0, 0
	for i := 1; i <= 40; i++ {
		rt, ok := en.Match("", &replay.Request{Client: netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", i)),
			Method: "GET", Path: "/search?q=x", Headers: map[string]string{"user-agent": "Mozilla/5.0"}})
		if !ok {
			t.Fatal("no route for /search")
		}
		resp := e.call(t, req("website", rlsDescriptors(rt.Descriptors)...))
		lease := resp.GetStatuses()[at]
		if held < leases { // one search per client: only the lease can deny
			if resp.GetOverallCode() != OK || lease.GetCode() != OK || lease.GetLimitRemaining() != uint32(leases-held-1) {
				t.Fatalf("search %d with %d leases held: %v, want admitted with %d left", i, held, resp.GetStatuses(), leases-held-1)
			}
			held++ // in flight: no release until it completes
			continue
		}
		if resp.GetOverallCode() != OVER || lease.GetCode() != OVER || lease.GetLimitRemaining() != 0 {
			t.Fatalf("search %d with all %d leases held: %v, want denied by search-in-flight", i, leases, resp.GetStatuses())
		}
		// Denied by Envoy: the stream ends and Envoy sends the release.
		if len(rt.OnStreamDoneDenied) == 0 {
			t.Fatal("the ungated release is not sent for a denied search")
		}
		rel := e.call(t, req("website", rlsDescriptors(rt.OnStreamDoneDenied)...))
		if len(rel.GetStatuses()) != 1 {
			t.Fatalf("release: %d statuses, want 1: %v", len(rel.GetStatuses()), rel)
		}
		held-- // one lease of a search still in flight
		foreign++
		if rs := rel.GetStatuses()[0]; rel.GetOverallCode() != OK || rs.GetCode() != OK || rs.GetLimitRemaining() != uint32(leases-held) {
			t.Fatalf("release after search %d: %v, want allowed with %d leases free (one returned)", i, rel.GetStatuses(), leases-held)
		}
	}
	if foreign == 0 || held != leases {
		t.Errorf("%d releases for denied searches, %d leases held at the end; want some, and all %d", foreign, held, leases)
	}
}
