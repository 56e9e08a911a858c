package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestJSONHandler(t *testing.T) {
	e := newEnv(t, nil)
	h := e.svc.JSONHandler()
	post := func(body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return rec
	}
	camel := `{"domain":"svc","descriptors":[{"entries":[{"key":"small","value":"s"}],"hitsAddend":1}]}`
	snake := `{"domain":"svc","descriptors":[{"entries":[{"key":"small","value":"s"}],"hits_addend":1}]}`
	for i, tc := range []struct {
		body      string
		code      int
		remaining uint32
	}{{camel, 200, 1}, {snake, 200, 0}, {camel, 429, 0}} {
		rec := post(tc.body)
		if rec.Code != tc.code {
			t.Fatalf("call %d: status %d, want %d: %s", i, rec.Code, tc.code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("call %d: Content-Type %q", i, ct)
		}
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatalf("call %d: body %s: %v", i, rec.Body, err)
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != tc.remaining {
			t.Errorf("call %d: remaining %d, want %d", i, got, tc.remaining)
		}
		// The same headers as response_headers_to_add, as HTTP headers.
		for _, hv := range resp.GetResponseHeadersToAdd() {
			if hv.GetKey() == "Content-Type" {
				continue
			}
			if got := rec.Header().Get(hv.GetKey()); got != hv.GetValue() {
				t.Errorf("call %d: header %s = %q, want %q", i, hv.GetKey(), got, hv.GetValue())
			}
		}
		if tc.code == 429 && (rec.Header().Get("Retry-After") != "30" || len(resp.GetRawBody()) == 0) {
			t.Errorf("429 without Retry-After or problem body: %v", rec.Header())
		}
	}
	for _, tc := range []struct {
		method, body string
		code         int
	}{
		{http.MethodPost, `{"domain":`, 400},
		{http.MethodPost, `{"domain":"svc","descriptors":[]}`, 400},
		{http.MethodPost, `{"domain":"svc","descriptors":[{"entries":[{"key":"","value":"x"}]}]}`, 400},
		{http.MethodPost, `{"domain":"svc","nope":1}`, 400},
		{http.MethodPost, `{"domain":"svc","descriptors":[{"entries":[{"key":"user","value":"u"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}`, 400},
		{http.MethodGet, ``, 405},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, "/json", strings.NewReader(tc.body)))
		if rec.Code != tc.code {
			t.Errorf("%s %s: status %d, want %d (%s)", tc.method, tc.body, rec.Code, tc.code, rec.Body)
		}
	}
	// Before any config: 503.
	svc, _ := service.New(service.Options{Store: newReferenceStore(&clock{now: t0})})
	rec := httptest.NewRecorder()
	svc.JSONHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(camel)))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("no config: status %d", rec.Code)
	}
}

// FuzzShouldRateLimit feeds arbitrary protobuf bytes to the handler: it
// must never panic, always answer InvalidArgument or a response with one
// status per descriptor and a defined overall code.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlsv3.RateLimitRequest{
		req("svc", d("user", "u")),
		req("svc", d("multi", "m"), withHits(d("bucket", "b"), 0), d("key_1", "value_1", "user", "x"), d("key_2", "value_2", "user", "x")),
		req("svc", d("conc", "c", "ratelimitd.release", ""), d("free", "f"), d("quota_a", "a"), d("shadowed", "s")),
		{Domain: "svc", HitsAddend: 4294967295, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries:    []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "\x00é\n:_{}"}},
			Limit:      &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: 6},
			HitsAddend: wrapperspb.UInt64(1 << 63),
		}}},
		req("", d("user", "u")),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	c := &clock{now: t0}
	st := newStore(f, c)
	svc, err := service.New(service.Options{
		Store: st, Fallback: newStore(f, c), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: c.Now,
		DynamicMetadata: true, Headers: service.HeadersBoth, NearLimitHeader: true,
	})
	if err != nil {
		f.Fatal(err)
	}
	svc.SetPolicy(loadSet(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &r)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		if len(resp.GetStatuses()) != len(r.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(r.GetDescriptors()))
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
			t.Fatal("overall code UNKNOWN")
		}
		for _, s := range resp.GetStatuses() {
			if s.GetCode() == rlsv3.RateLimitResponse_UNKNOWN {
				t.Fatal("status code UNKNOWN")
			}
		}
	})
}
