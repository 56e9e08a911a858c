package service_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const shouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// escaped is the documented escaped form of a string that is not valid
// UTF-8: U+FFFD followed by the lowercase hex of the raw bytes.
func escaped(raw string) string { return "\uFFFD" + hex.EncodeToString([]byte(raw)) }

// rawBytes is a request already in wire form.
type rawBytes []byte

// rawClientCodec lets the test client send arbitrary wire bytes (the
// default codec refuses to marshal invalid UTF-8) and decodes responses
// with protobuf.
type rawClientCodec struct{}

func (rawClientCodec) Name() string { return grpcproto.Name }

func (rawClientCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), v.(rawBytes)...))}, nil
}

func (rawClientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// wire builders (protowire, independent of the code under test).

type wEntry struct{ key, value string }

type wDesc struct {
	entries  []wEntry
	limit    *[2]uint64 // requests_per_unit, unit
	hits     *uint64    // RateLimitDescriptor.hits_addend (UInt64Value)
	negative bool       // is_negative_hits
}

type wReq struct {
	domain string
	descs  []wDesc
	hits   uint32
}

func (e wEntry) wire() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, e.key)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendString(b, e.value)
}

func (d wDesc) wire() []byte {
	var b []byte
	for _, e := range d.entries {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, e.wire())
	}
	if d.limit != nil {
		var l []byte
		l = protowire.AppendTag(l, 1, protowire.VarintType)
		l = protowire.AppendVarint(l, d.limit[0])
		l = protowire.AppendTag(l, 2, protowire.VarintType)
		l = protowire.AppendVarint(l, d.limit[1])
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, l)
	}
	if d.hits != nil {
		var h []byte
		h = protowire.AppendTag(h, 1, protowire.VarintType)
		h = protowire.AppendVarint(h, *d.hits)
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, h)
	}
	if d.negative {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b
}

func (r wReq) wire() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.domain)
	for _, d := range r.descs {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d.wire())
	}
	if r.hits != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.hits))
	}
	return b
}

// want is the message the codec must produce for r: every string that is
// not valid UTF-8 escaped.
func (r wReq) want() *rlsv3.RateLimitRequest {
	fix := func(s string) string {
		if utf8.ValidString(s) {
			return s
		}
		return escaped(s)
	}
	out := &rlsv3.RateLimitRequest{Domain: fix(r.domain), HitsAddend: r.hits}
	for _, d := range r.descs {
		pd := &rlcommon.RateLimitDescriptor{IsNegativeHits: d.negative}
		for _, e := range d.entries {
			pd.Entries = append(pd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fix(e.key), Value: fix(e.value)})
		}
		if d.limit != nil {
			pd.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(d.limit[0]), Unit: typev3.RateLimitUnit(int32(d.limit[1]))}
		}
		if d.hits != nil {
			pd.HitsAddend = wrapperspb.UInt64(*d.hits)
		}
		out.Descriptors = append(out.Descriptors, pd)
	}
	return out
}

func rawReq(domain string, kv ...string) rawBytes {
	r := wReq{domain: domain}
	for i := 0; i+1 < len(kv); i += 2 {
		r.descs = append(r.descs, wDesc{entries: []wEntry{{kv[i], kv[i+1]}}})
	}
	return r.wire()
}

// codecEnv is one service behind a bufconn gRPC server with (or without)
// the service's codec.
type codecEnv = env

func newCodecEnv(t testing.TB, withCodec bool, mutate func(*service.Options)) *codecEnv {
	t.Helper()
	return startEnv(t, withCodec, mutate)
}

func (e *codecEnv) send(b rawBytes) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{}
	err := e.conn.Invoke(context.Background(), shouldRateLimitMethod, b, resp, grpc.ForceCodecV2(rawClientCodec{}))
	return resp, err
}

func (e *codecEnv) invalidCount() float64 {
	return counterSum(e.reg, "ratelimitd_invalid_utf8_requests_total")
}

// counterSum gathers reg and sums the samples of the counter family name
// (0 when absent).
func counterSum(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// hasSeries reports whether the family name has a series whose label
// equals value.
func hasSeries(t *testing.T, reg *prometheus.Registry, name, label, value string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return true
				}
			}
		}
	}
	return false
}

// Without the codec, one invalid UTF-8 value fails the whole call: this is
// the hole the codec closes (and proves the test sends what Envoy sends).
func TestInvalidUTF8WithoutCodecFailsWholeCall(t *testing.T) {
	e := newCodecEnv(t, false, nil)
	_, err := e.send(rawReq("svc", "small", "s", "user", "\xff"))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Fatalf("default codec: err = %v, want Internal invalid UTF-8", err)
	}
}

// With the codec, invalid UTF-8 values are limited per value: the same
// invalid value shares a counter, two different invalid values do not, a
// valid value never shares with an invalid one unless it literally spells
// the escaped form (documented).
func TestInvalidUTF8ValueLimitedPerValue(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	small := func(rem uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return st(OK, limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE), rem, 30*time.Second)
	}
	over := st(OVER, limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE), 0, 30*time.Second)
	for i, step := range []struct {
		name    string
		value   string
		overall rlsv3.RateLimitResponse_Code
		want    *rlsv3.RateLimitResponse_DescriptorStatus
		invalid float64 // counter after the step
	}{
		{"first \\xff", "\xff", OK, small(1), 1},
		{"second \\xff", "\xff", OK, small(0), 2},
		{"third \\xff is over", "\xff", OVER, over, 3},
		{"\\xfe has its own counter", "\xfe", OK, small(1), 4},
		{"valid U+00FF (c3 bf) has its own counter", "\u00ff", OK, small(1), 4},
		{"a\\x80b (obs-text inside text)", "a\x80b", OK, small(1), 5},
		{"valid literal escaped form of \\xff shares its counter", escaped("\xff"), OVER, over, 5},
	} {
		resp, err := e.send(rawReq("svc", "small", step.value))
		if err != nil {
			t.Fatalf("step %d %s: %v", i, step.name, err)
		}
		checkStatuses(t, step.name, resp, step.overall, step.want)
		if got := e.invalidCount(); got != step.invalid {
			t.Errorf("step %d %s: ratelimitd_invalid_utf8_requests_total = %v, want %v", i, step.name, got, step.invalid)
		}
	}
}

// Every descriptor of a request with one invalid value is evaluated (the
// bypass was that none was).
func TestInvalidUTF8OtherDescriptorsStillEvaluated(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	userLimit := limit("", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	smallLimit := limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE)
	for i, want := range []struct {
		overall    rlsv3.RateLimitResponse_Code
		user, smal *rlsv3.RateLimitResponse_DescriptorStatus
	}{
		{OK, st(OK, userLimit, 9, 30*time.Second), st(OK, smallLimit, 1, 30*time.Second)},
		{OK, st(OK, userLimit, 8, 30*time.Second), st(OK, smallLimit, 0, 30*time.Second)},
		// denied by the valid descriptor: nothing consumed, the invalid
		// one reports its value before the request.
		{OVER, st(OK, userLimit, 8, 30*time.Second), st(OVER, smallLimit, 0, 30*time.Second)},
	} {
		resp, err := e.send(rawReq("svc", "user", "u\xc0", "small", "s"))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		checkStatuses(t, "step", resp, want.overall, want.user, want.smal)
	}
}

// Invalid keys and domains are escaped too: they then match no rule
// (config strings are UTF-8), which is what a valid unknown key or domain
// gets.
func TestInvalidUTF8KeyAndDomain(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	resp, err := e.send(rawReq("svc", "sm\xe2all", "s", "small", "s"))
	if err != nil {
		t.Fatal(err)
	}
	checkStatuses(t, "invalid key", resp, OK, st(OK, nil, 0, 0), st(OK, limit("small", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE), 1, 30*time.Second))

	resp, err = e.send(rawReq("svc\xf0\x28", "small", "s"))
	if err != nil {
		t.Fatal(err)
	}
	checkStatuses(t, "invalid domain", resp, OK, st(OK, nil, 0, 0))
	if got := counterSum(e.reg, "ratelimitd_unknown_domain_requests_total"); got != 1 {
		t.Errorf("unknown domain requests = %v, want 1", got)
	}
	if got := e.invalidCount(); got != 2 {
		t.Errorf("invalid UTF-8 requests = %v, want 2", got)
	}
	if hasSeries(t, e.reg, "ratelimitd_requests_total", "domain", escaped("svc\xf0\x28")) {
		t.Error("a request domain became a metric label")
	}
}

// The escaped values are what the dynamic metadata and the
// detailed_metric labels carry.
func TestInvalidUTF8DynamicMetadataAndDetailedLabel(t *testing.T) {
	e := newCodecEnv(t, true, func(o *service.Options) { o.DynamicMetadata = true })
	resp, err := e.send(rawReq("svc", "detailed", "\xff\xfe"))
	if err != nil {
		t.Fatal(err)
	}
	md := resp.GetDynamicMetadata().AsMap()
	descs, _ := md["descriptors"].([]any)
	if len(descs) != 1 {
		t.Fatalf("dynamic metadata %v: want one descriptor", md)
	}
	entries, _ := descs[0].(map[string]any)["entries"].([]any)
	if len(entries) != 1 || entries[0] != "detailed="+escaped("\xff\xfe") {
		t.Errorf("dynamic metadata entries = %v, want [detailed=%s]", entries, escaped("\xff\xfe"))
	}
	if !hasSeries(t, e.reg, "ratelimitd_decisions_total", "rule", "svc.detailed_"+escaped("\xff\xfe")) {
		t.Error("no decisions series with the escaped detailed_metric label")
	}
}

// In-process callers bypass the codec: a detailed_metric label or dynamic
// metadata built from an invalid value must not panic (prometheus) or be
// dropped (structpb).
func TestInProcessInvalidUTF8(t *testing.T) {
	e := newCodecEnv(t, true, func(o *service.Options) { o.DynamicMetadata = true })
	resp, err := e.svc.ShouldRateLimit(context.Background(), req("svc\xff", d("detailed", "x")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetDynamicMetadata().AsMap()["domain"]; got != escaped("svc\xff") {
		t.Errorf("dynamic metadata domain = %v, want %q", got, escaped("svc\xff"))
	}
	resp, err = e.svc.ShouldRateLimit(context.Background(), req("svc", d("detailed", "\xff")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDynamicMetadata() == nil {
		t.Fatal("dynamic metadata dropped")
	}
	if !hasSeries(t, e.reg, "ratelimitd_decisions_total", "rule", escaped("svc.detailed_\xff")) {
		t.Error("no decisions series with the escaped detailed_metric label")
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Errorf("response not marshalable: %v", err)
	}
	if got := e.invalidCount(); got != 0 {
		t.Errorf("in-process calls counted as invalid UTF-8 requests: %v", got)
	}
}

// POST /json keeps rejecting invalid UTF-8 (JSON text is UTF-8) with 400,
// raw bytes and lone surrogate escapes alike, and does not count it; the
// character escape of the same code point is answered.
func TestJSONInvalidUTF8Is400(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	h := e.svc.JSONHandler()
	for _, tc := range []struct {
		name, value string
		code        int
	}{
		{"raw \\xff", "\xff", http.StatusBadRequest},
		{"raw a\\x80b", "a\x80b", http.StatusBadRequest},
		{"lone surrogate escape", `\udc80`, http.StatusBadRequest},
		{"escaped U+00FF", `\u00ff`, http.StatusOK},
	} {
		body := `{"domain":"svc","descriptors":[{"entries":[{"key":"small","value":"` + tc.value + `"}]}]}`
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		if rec.Code != tc.code {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, rec.Code, tc.code, rec.Body)
		}
	}
	if got := e.invalidCount(); got != 0 {
		t.Errorf("/json counted in ratelimitd_invalid_utf8_requests_total: %v", got)
	}
}

// Malformed wire data still fails with the default codec's error, with or
// without invalid UTF-8 before the damage.
func TestMalformedWireStillRejected(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	codec := e.svc.ServerCodec()
	def := encoding.GetCodecV2(grpcproto.Name)
	good := rawReq("svc\xff", "small", "\xff")
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"truncated", good[:len(good)-1]},
		{"length past the end", append(append([]byte{}, good...), 0x12, 0x05, 0x0a)},
		{"field number 0", append(append([]byte{}, good...), 0x00, 0x01)},
		{"stray end group", append(append([]byte{}, good...), 0x0c)},
		{"unterminated group", append(append([]byte{}, good...), 0x23, 0x08, 0x01)},
		{"invalid varint", append(append([]byte{}, good...), 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{"bad descriptor bytes", append(rawReq("svc\xff"), 0x12, 0x02, 0x0a, 0x05)},
		{"bad entry bytes", append(rawReq("svc\xff"), 0x12, 0x04, 0x0a, 0x02, 0x0a, 0x07)},
	} {
		wantErr := def.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, &rlsv3.RateLimitRequest{})
		if wantErr == nil {
			t.Fatalf("%s: default codec accepted the case; fix the test", tc.name)
		}
		gotErr := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, &rlsv3.RateLimitRequest{})
		if gotErr == nil || gotErr.Error() != wantErr.Error() {
			t.Errorf("%s: err = %v, want the default codec's %v", tc.name, gotErr, wantErr)
		}
		if _, err := e.send(tc.b); status.Code(err) != codes.Internal {
			t.Errorf("%s over gRPC: err = %v, want Internal", tc.name, err)
		}
	}
	if got := e.invalidCount(); got != 0 {
		t.Errorf("rejected requests counted: %v", got)
	}
}

// Other message types keep the default codec's strictness, and Marshal
// is the default codec's.
func TestCodecOtherMessagesUnchanged(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	codec := e.svc.ServerCodec()
	if codec.Name() != grpcproto.Name {
		t.Errorf("Name = %q", codec.Name())
	}
	var b []byte
	b = protowire.AppendTag(b, 3, protowire.BytesType) // RateLimitResponse.request_headers_to_add
	var hv []byte
	hv = protowire.AppendTag(hv, 1, protowire.BytesType)
	hv = protowire.AppendString(hv, "k\xff")
	b = protowire.AppendBytes(b, hv)
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendBytes(b, hv)
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &rlsv3.RateLimitResponse{}); err == nil {
		t.Error("RateLimitResponse with invalid UTF-8 accepted")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: OVER, RawBody: []byte("{}")}
	got, err := codec.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(resp)
	if string(got.Materialize()) != string(want) {
		t.Error("Marshal differs from proto.Marshal")
	}
	got.Free()
	if _, err := codec.Marshal("not a message"); err == nil {
		t.Error("Marshal of a non-message succeeded")
	}
}

// The value bound (MaxValueBytes) applies to the bytes the client sent:
// a value of invalid UTF-8 up to the bound is decided although its escaped
// form is twice as long (refusing it would fail the whole call, which
// Envoy's default failure_mode_deny: false admits uncounted); one byte
// more is refused, with its raw length in the message.
func TestInvalidUTF8ValueBoundIsRaw(t *testing.T) {
	e := newCodecEnv(t, true, nil)
	for _, n := range []int{32767, 40000, service.MaxValueBytes} {
		resp, err := e.send(rawReq("svc", "small", strings.Repeat("\xff", n)))
		if err != nil {
			t.Fatalf("%d bytes of \\xff: %v, want a decision", n, err)
		}
		if resp.GetStatuses()[0].GetCurrentLimit() == nil {
			t.Errorf("%d bytes of \\xff: %v, want the small rule applied", n, resp)
		}
	}
	_, err := e.send(rawReq("svc", "small", strings.Repeat("\xff", service.MaxValueBytes+1)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("value is %d bytes", service.MaxValueBytes+1)) {
		t.Errorf("%d bytes of \\xff: %v, want InvalidArgument naming %d bytes", service.MaxValueBytes+1, err, service.MaxValueBytes+1)
	}
}
