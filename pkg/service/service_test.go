package service_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

func limit(name string, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit}
}

func st(code rlsv3.RateLimitResponse_Code, cl *rlsv3.RateLimitResponse_RateLimit, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	s := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: cl, LimitRemaining: remaining}
	if cl != nil {
		s.DurationUntilReset = durationpb.New(reset)
	}
	return s
}

// statuses compares overall code and statuses only.
func checkStatuses(t *testing.T, step string, resp *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, want ...*rlsv3.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	got := &rlsv3.RateLimitResponse{OverallCode: resp.GetOverallCode(), Statuses: resp.GetStatuses()}
	exp := &rlsv3.RateLimitResponse{OverallCode: overall, Statuses: want}
	if diff := cmp.Diff(exp, got, protocmp.Transform()); diff != "" {
		t.Errorf("%s: response mismatch (-want +got):\n%s", step, diff)
	}
}

func TestInvalidArgument(t *testing.T) {
	e := newEnv(t, nil)
	long := strings.Repeat("x", service.MaxValueBytes+1)
	many := func(n int) []*rlcommon.RateLimitDescriptor {
		out := make([]*rlcommon.RateLimitDescriptor, n)
		for i := range out {
			out[i] = d("user", "u")
		}
		return out
	}
	manyEntries := d()
	for i := 0; i <= service.MaxEntries; i++ {
		manyEntries.Entries = append(manyEntries.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	badUnit := d("user", "u")
	badUnit.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_UNKNOWN}
	outOfRange := d("user", "u")
	outOfRange.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit(42)}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", req("", d("user", "u")), "domain must not be empty"},
		{"long domain", req(long, d("user", "u")), "domain is 65537 bytes"},
		{"no descriptors", req("svc"), "descriptor list must not be empty"},
		{"too many descriptors", req("svc", many(service.MaxDescriptors+1)...), "65 descriptors, more than the bound of 64"},
		{"no entries", req("svc", d("user", "u"), d()), "descriptor 1 has no entries"},
		{"too many entries", req("svc", manyEntries), "33 entries, more than the bound of 32"},
		{"empty key", req("svc", d("", "u")), "descriptor 0 entry 0: key must not be empty"},
		{"long key", req("svc", d(long, "u")), "key is 65537 bytes"},
		{"long value", req("svc", d("user", long)), "value is 65537 bytes"},
		{"unknown override unit", req("svc", badUnit), "limit override unit UNKNOWN is invalid"},
		{"out of range override unit", req("svc", outOfRange), "limit override unit 42 is invalid"},
		{"nil entry", req("svc", &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{nil}}), "key must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
	if e.store.Calls() != 0 {
		t.Errorf("store called %d times for invalid requests", e.store.Calls())
	}
}

func TestNoConfigUnavailable(t *testing.T) {
	svc, err := service.New(service.Options{Store: newReferenceStore(&clock{now: t0})})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Ready() {
		t.Fatal("ready before a config")
	}
	_, err = svc.ShouldRateLimit(context.Background(), req("svc", d("user", "u")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	svc.SetPolicy(loadSet(t))
	if !svc.Ready() {
		t.Fatal("not ready after SetPolicy")
	}
	svc.SetShuttingDown()
	if svc.Ready() {
		t.Fatal("ready while shutting down")
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (service.Options{}).Validate(); err == nil {
		t.Error("missing store accepted")
	}
	if err := (service.Options{Store: newReferenceStore(&clock{}), NearLimitRatio: 1.5}).Validate(); err == nil {
		t.Error("ratio 1.5 accepted")
	}
	for in, want := range map[string]service.HeaderMode{"": service.HeadersIETF, "IETF": service.HeadersIETF, "legacy": service.HeadersLegacy, "both": service.HeadersBoth, "none": service.HeadersNone} {
		if got, err := service.ParseHeaderMode(in); err != nil || got != want {
			t.Errorf("ParseHeaderMode(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := service.ParseHeaderMode("draft03"); err == nil {
		t.Error("unknown header mode accepted")
	}
}

func TestFixedWindowSteps(t *testing.T) {
	e := newEnv(t, nil)
	lim := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	for i := 1; i <= 10; i++ {
		resp := e.call(t, req("svc", d("user", "alice")))
		checkStatuses(t, fmt.Sprint("call ", i), resp, OK, st(OK, lim, uint32(10-i), 30*time.Second))
	}
	resp := e.call(t, req("svc", d("user", "alice")))
	checkStatuses(t, "call 11", resp, OVER, st(OVER, lim, 0, 30*time.Second))
	// Another user has its own counter.
	resp = e.call(t, req("svc", d("user", "bob")))
	checkStatuses(t, "bob", resp, OK, st(OK, lim, 9, 30*time.Second))
	// The next window starts at 00:01:00.
	e.clock.Advance(30 * time.Second)
	resp = e.call(t, req("svc", d("user", "alice")))
	checkStatuses(t, "next window", resp, OK, st(OK, lim, 9, 60*time.Second))
}

func TestWholeRequest(t *testing.T) {
	e := newEnv(t, nil)
	small := limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	big := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	both := req("svc", d("small", "x"), d("big", "x"))
	checkStatuses(t, "1", e.call(t, both), OK, st(OK, small, 1, 30*time.Second), st(OK, big, 9, 30*time.Second))
	checkStatuses(t, "2", e.call(t, both), OK, st(OK, small, 0, 30*time.Second), st(OK, big, 8, 30*time.Second))
	// Denied by small: big consumes nothing and reports its value before.
	checkStatuses(t, "3", e.call(t, both), OVER, st(OVER, small, 0, 30*time.Second), st(OK, big, 8, 30*time.Second))
	checkStatuses(t, "4", e.call(t, both), OVER, st(OVER, small, 0, 30*time.Second), st(OK, big, 8, 30*time.Second))
	checkStatuses(t, "big alone", e.call(t, req("svc", d("big", "x"))), OK, st(OK, big, 7, 30*time.Second))
}

func TestHitsAddend(t *testing.T) {
	lim := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	type step struct {
		reqHits  uint32
		descHits *uint64
		code     rlsv3.RateLimitResponse_Code
		remain   uint32
	}
	u := func(n uint64) *uint64 { return &n }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"request level, 0 means 1", []step{{0, nil, OK, 9}, {3, nil, OK, 6}, {6, nil, OK, 0}, {1, nil, OVER, 0}}},
		{"descriptor overrides request", []step{{2, u(5), OK, 5}, {2, nil, OK, 3}, {9, u(3), OK, 0}}},
		{"explicit 0 is check only", []step{{0, u(0), OK, 10}, {0, u(10), OK, 0}, {0, u(0), OVER, 0}}},
		{"cost above capacity is denied, never wraps", []step{{0, u(11), OVER, 10}, {0, u(math.MaxUint64), OVER, 10}, {math.MaxUint32, nil, OVER, 10}, {0, nil, OK, 9}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			for i, s := range tc.steps {
				x := d("user", "u")
				if s.descHits != nil {
					x = withHits(x, *s.descHits)
				}
				r := req("svc", x)
				r.HitsAddend = s.reqHits
				checkStatuses(t, fmt.Sprint("step ", i), e.call(t, r), s.code, st(s.code, lim, s.remain, 30*time.Second))
			}
		})
	}
}

func TestReplaces(t *testing.T) {
	e := newEnv(t, nil)
	spec := limit("specific_limit", 5, rlsv3.RateLimitResponse_RateLimit_SECOND)
	gen := limit("", 10, rlsv3.RateLimitResponse_RateLimit_SECOND)
	a := func() *rlcommon.RateLimitDescriptor { return d("key_1", "value_1", "user", "bkthomps") }
	b := func() *rlcommon.RateLimitDescriptor { return d("key_2", "value_2", "user", "bkthomps") }
	// Both in one request: only the 10/s rule counts.
	for i := 0; i < 10; i++ {
		checkStatuses(t, fmt.Sprint("both ", i), e.call(t, req("svc", a(), b())), OK,
			st(OK, nil, 0, 0), st(OK, gen, uint32(9-i), time.Second))
	}
	// specific_limit was never consumed.
	checkStatuses(t, "a alone", e.call(t, req("svc", a())), OK, st(OK, spec, 4, time.Second))
}

func TestUnlimitedNoMatchUnknownDomain(t *testing.T) {
	e := newEnv(t, nil)
	resp := e.call(t, req("svc", d("free", "x"), d("nomatch", "x"), d("user", "u", "deeper", "y")))
	checkStatuses(t, "svc", resp, OK, st(OK, nil, math.MaxUint32, 0), st(OK, nil, 0, 0), st(OK, nil, 0, 0))
	if len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("headers without an applied limit: %v", resp.GetResponseHeadersToAdd())
	}
	resp = e.call(t, req("nosuchdomain", d("user", "u")))
	checkStatuses(t, "unknown domain", resp, OK, st(OK, nil, 0, 0))
	if e.store.Calls() != 0 {
		t.Errorf("store called %d times without applied limits", e.store.Calls())
	}
}

func TestShadowRule(t *testing.T) {
	e := newEnv(t, nil)
	sh := limit("", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	u := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	r := func() *rlsv3.RateLimitRequest { return req("svc", d("shadowed", "x"), d("user", "u")) }
	checkStatuses(t, "1", e.call(t, r()), OK, st(OK, sh, 0, 30*time.Second), st(OK, u, 9, 30*time.Second))
	// The shadow rule is over, the request passes and the enforced limit consumes.
	resp := e.call(t, r())
	checkStatuses(t, "2", resp, OK, st(OK, sh, 0, 30*time.Second), st(OK, u, 8, 30*time.Second))
	checkStatuses(t, "3", e.call(t, r()), OK, st(OK, sh, 0, 30*time.Second), st(OK, u, 7, 30*time.Second))
	if h := headers(t, resp); h["Retry-After"] != "" || resp.GetRawBody() != nil {
		t.Errorf("shadow response carries denial: %v %s", h, resp.GetRawBody())
	}
}

func TestGlobalShadow(t *testing.T) {
	e := newEnv(t, func(o *service.Options) { o.ShadowMode = true })
	lim := limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	e.call(t, req("svc", d("small", "x")))
	e.call(t, req("svc", d("small", "x")))
	resp := e.call(t, req("svc", d("small", "x")))
	checkStatuses(t, "flipped", resp, OK, st(OVER, lim, 0, 30*time.Second))
	h := headers(t, resp)
	if h["RateLimit"] == "" || h["Retry-After"] != "" || resp.GetRawBody() != nil {
		t.Errorf("global shadow: headers %v body %q", h, resp.GetRawBody())
	}
}

func TestQuotaMode(t *testing.T) {
	lim := limit("", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	u := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	e := newEnv(t, nil)
	both := func() *rlsv3.RateLimitRequest { return req("svc", d("quota_a", "x"), d("quota_b", "x")) }
	// Use up quota_a only.
	checkStatuses(t, "a", e.call(t, req("svc", d("quota_a", "x"))), OK, st(OK, lim, 0, 30*time.Second))
	// quota_a over, quota_b passes: the request passes and quota_b consumes.
	checkStatuses(t, "one over", e.call(t, both()), OK, st(OVER, lim, 0, 30*time.Second), st(OK, lim, 0, 30*time.Second))
	// Both over: denied.
	checkStatuses(t, "all over", e.call(t, both()), OVER, st(OVER, lim, 0, 30*time.Second), st(OVER, lim, 0, 30*time.Second))
	// A non-quota descriptor still enforces.
	e2 := newEnv(t, nil)
	e2.call(t, req("svc", d("quota_a", "x")))
	for i := 0; i < 10; i++ {
		e2.call(t, req("svc", d("user", "u")))
	}
	checkStatuses(t, "non-quota over", e2.call(t, req("svc", d("quota_b", "y"), d("user", "u"))), OVER,
		st(OK, lim, 1, 30*time.Second), st(OVER, u, 0, 30*time.Second))

	// Global quota mode: every limited descriptor is a quota descriptor.
	e3 := newEnv(t, func(o *service.Options) { o.QuotaMode = true })
	small := limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	e3.call(t, req("svc", d("small", "x")))
	e3.call(t, req("svc", d("small", "x")))
	checkStatuses(t, "global quota", e3.call(t, req("svc", d("small", "x"), d("user", "u"))), OK,
		st(OVER, small, 0, 30*time.Second), st(OK, u, 9, 30*time.Second))
}

func TestRequestOverride(t *testing.T) {
	ov := func() *rlcommon.RateLimitDescriptor {
		x := d("user", "u")
		x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
		return x
	}
	e := newEnv(t, nil)
	lim := limit("", 2, rlsv3.RateLimitResponse_RateLimit_HOUR)
	checkStatuses(t, "1", e.call(t, req("svc", ov())), OK, st(OK, lim, 1, 3570*time.Second))
	checkStatuses(t, "2", e.call(t, req("svc", ov())), OK, st(OK, lim, 0, 3570*time.Second))
	checkStatuses(t, "3", e.call(t, req("svc", ov())), OVER, st(OVER, lim, 0, 3570*time.Second))
	// The override does not share the config rule's counter.
	checkStatuses(t, "config", e.call(t, req("svc", d("user", "u"))), OK,
		st(OK, limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 9, 30*time.Second))
	// Unknown domain: overrides are not honoured (as envoyproxy/ratelimit).
	checkStatuses(t, "unknown domain", e.call(t, req("other", ov())), OK, st(OK, nil, 0, 0))

	off := newEnv(t, func(o *service.Options) { o.IgnoreRequestOverrides = true })
	checkStatuses(t, "ignored", off.call(t, req("svc", ov())), OK,
		st(OK, limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE), 9, 30*time.Second))
}

// TestRequestOverridesIndependent: two descriptors of one request with
// the same entries and overrides of another rate (10/minute, 1000/minute)
// or unit (10/hour) count on their own counters: the 1000/minute status
// shows 999 after the first call, not 998.
func TestRequestOverridesIndependent(t *testing.T) {
	ov := func(rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		x := d("user", "u", "path", "/p")
		x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		return x
	}
	r := func() *rlsv3.RateLimitRequest {
		return req("svc", ov(10, typev3.RateLimitUnit_MINUTE), ov(1000, typev3.RateLimitUnit_MINUTE), ov(10, typev3.RateLimitUnit_HOUR))
	}
	e := newEnv(t, nil)
	l10 := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	l1000 := limit("", 1000, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	l10h := limit("", 10, rlsv3.RateLimitResponse_RateLimit_HOUR)
	checkStatuses(t, "1", e.call(t, r()), OK,
		st(OK, l10, 9, 30*time.Second), st(OK, l1000, 999, 30*time.Second), st(OK, l10h, 9, 3570*time.Second))
	for range 8 {
		e.call(t, r())
	}
	checkStatuses(t, "10", e.call(t, r()), OK,
		st(OK, l10, 0, 30*time.Second), st(OK, l1000, 990, 30*time.Second), st(OK, l10h, 0, 3570*time.Second))
	// 10/minute and 10/hour are over; the request consumes nothing.
	checkStatuses(t, "11", e.call(t, r()), OVER,
		st(OVER, l10, 0, 30*time.Second), st(OK, l1000, 990, 30*time.Second), st(OVER, l10h, 0, 3570*time.Second))
	// The 1000/minute counter on its own.
	checkStatuses(t, "1000 alone", e.call(t, req("svc", ov(1000, typev3.RateLimitUnit_MINUTE))), OK,
		st(OK, l1000, 989, 30*time.Second))
	// The next minute: the 10/minute counter is fresh, 10/hour is not.
	e.clock.Advance(time.Minute)
	checkStatuses(t, "next minute", e.call(t, req("svc", ov(10, typev3.RateLimitUnit_MINUTE), ov(10, typev3.RateLimitUnit_HOUR))), OVER,
		st(OK, l10, 10, 30*time.Second), st(OVER, l10h, 0, 3510*time.Second))
}

func TestSeveralLimitsOnOneNode(t *testing.T) {
	e := newEnv(t, nil)
	p10 := limit("per-10s", 3, rlsv3.RateLimitResponse_RateLimit_SECOND)
	p10.UnitMultiplier = wrapperspb.UInt32(10)
	ph := limit("per-hour", 5, rlsv3.RateLimitResponse_RateLimit_HOUR)
	r := func() *rlsv3.RateLimitRequest { return req("svc", d("multi", "m")) }
	// Least remaining: per-10s (2) before per-hour (4).
	checkStatuses(t, "1", e.call(t, r()), OK, st(OK, p10, 2, 10*time.Second))
	e.call(t, r())
	checkStatuses(t, "3", e.call(t, r()), OK, st(OK, p10, 0, 10*time.Second))
	checkStatuses(t, "4 denied by per-10s", e.call(t, r()), OVER, st(OVER, p10, 0, 10*time.Second))
	e.clock.Advance(10 * time.Second) // new 10 s window at :40
	// The denied call 4 consumed nothing: per-hour has 2 left.
	checkStatuses(t, "5 least is per-hour", e.call(t, r()), OK, st(OK, ph, 1, 3560*time.Second))
	checkStatuses(t, "6", e.call(t, r()), OK, st(OK, ph, 0, 3560*time.Second))
	checkStatuses(t, "7 denied by per-hour", e.call(t, r()), OVER, st(OVER, ph, 0, 3560*time.Second))
	// per-10s was not consumed by the denied call 7: a fresh window, and
	// a check-only call reports it (per-hour is denied first in config order? no:
	// the status reports the limit that denied).
	checkStatuses(t, "8 check only", e.call(t, req("svc", withHits(d("multi", "m"), 0))), OVER, st(OVER, ph, 0, 3560*time.Second))
}

func TestConcurrencyRelease(t *testing.T) {
	e := newEnv(t, nil)
	lim := limit("", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	acquire := func() *rlsv3.RateLimitRequest { return req("svc", d("conc", "c")) }
	release := func() *rlsv3.RateLimitRequest { return req("svc", d("conc", "c", "ratelimitd.release", "")) }
	checkStatuses(t, "1", e.call(t, acquire()), OK, st(OK, lim, 1, 60*time.Second))
	checkStatuses(t, "2", e.call(t, acquire()), OK, st(OK, lim, 0, 60*time.Second))
	if resp := e.call(t, acquire()); resp.GetOverallCode() != OVER {
		t.Fatalf("third lease allowed: %v", resp)
	}
	if resp := e.call(t, release()); resp.GetOverallCode() != OK {
		t.Fatalf("release denied: %v", resp)
	}
	if resp := e.call(t, acquire()); resp.GetOverallCode() != OK {
		t.Fatalf("lease after release denied: %v", resp)
	}
}

func TestFiftyConcurrentCallsTenPerMinute(t *testing.T) {
	e := newEnv(t, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, over := 0, 0
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.client.ShouldRateLimit(context.Background(), req("svc", d("user", "hot")))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case resp.GetOverallCode() == OK:
				ok++
			default:
				over++
			}
		}()
	}
	wg.Wait()
	if ok != 10 || over != 40 {
		t.Fatalf("ok=%d over=%d, want 10 and 40", ok, over)
	}
}

// A check-only descriptor (hits_addend 0) that is OVER_LIMIT denies the
// request, so the request's other limits consume nothing; a shadow rule's
// denial does not, and the enforced limit counts the request in the same
// single store call.
func TestCheckOnlyDenialConsumesNothingShadowDenialDoes(t *testing.T) {
	e := newEnv(t, nil)
	// exhaust small (2/minute)
	for i := 0; i < 2; i++ {
		if r := e.call(t, req("svc", d("small", "x"))); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i, r.GetOverallCode())
		}
	}
	calls := e.store.Calls()
	r := e.call(t, req("svc", d("user", "u1"), withHits(d("small", "x"), 0)))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("check-only on an exhausted limit: %v, want OVER_LIMIT", r.GetOverallCode())
	}
	if got := r.GetStatuses()[0].GetLimitRemaining(); got != 10 {
		t.Errorf("user remaining in the denied request = %d, want 10 (value before)", got)
	}
	if r := e.call(t, req("svc", d("user", "u1"))); r.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Errorf("after the denied request user remaining = %d, want 9 (nothing consumed before)", r.GetStatuses()[0].GetLimitRemaining())
	}
	// shadowed: 1/minute; the first request passes it, the second is over
	// (shadow) yet allowed, and user counts both.
	e.call(t, req("svc", d("shadowed", "s"), d("user", "u2")))
	r = e.call(t, req("svc", d("shadowed", "s"), d("user", "u2")))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("shadow denial: overall %v, want OK", r.GetOverallCode())
	}
	if got := r.GetStatuses()[1].GetLimitRemaining(); got != 8 {
		t.Errorf("user remaining after two requests with a shadow denial = %d, want 8", got)
	}
	if got := e.store.Calls() - calls; got != 4 {
		t.Errorf("store calls for 4 requests = %d, want 4 (one per request)", got)
	}
}
