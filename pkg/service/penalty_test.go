package service_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPenaltyResponse: the second denial within the hour starts a 5 min
// block; its 429 and every one until the block's end carry Retry-After =
// the time to the block's end and a problem body saying the client is
// blocked; the block is counted once, each blocked request once; after
// the block the limit applies again. A shadow-mode rule never blocks.
func TestPenaltyResponse(t *testing.T) {
	e := newEnv(t, nil)
	e.svc.SetPolicy(loadSet(t, "testdata/penalty.yaml"))
	call := func() (string, string, map[string]any) {
		t.Helper()
		resp := e.call(t, req("pen", d("client", "c")))
		h := headers(t, resp)
		var p map[string]any
		if resp.GetOverallCode() == OVER {
			if err := json.Unmarshal(resp.GetRawBody(), &p); err != nil {
				t.Fatalf("body %q: %v", resp.GetRawBody(), err)
			}
		}
		return resp.GetOverallCode().String(), h["Retry-After"], p
	}
	blockedBody := func(retry float64) map[string]any {
		return map[string]any{
			"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
			"title":             "Quota Exceeded",
			"status":            float64(429),
			"detail":            `Policy "client" was exceeded 2 times within 3600 seconds, so this client is blocked for 300 seconds; retry after ` + jsonInt(retry) + ` seconds.`,
			"violated-policies": []any{"client"},
			"retry_after":       retry,
		}
	}
	labels := map[string]string{"domain": "pen", "rule": "pen.client"}
	for range 2 {
		if code, _, _ := call(); code != "OK" {
			t.Fatalf("within the limit: %s", code)
		}
	}
	if code, retry, _ := call(); code != "OVER_LIMIT" || retry != "30" {
		t.Fatalf("first denial: %s Retry-After %q, want OVER_LIMIT 30 (window end)", code, retry)
	}
	code, retry, body := call()
	if code != "OVER_LIMIT" || retry != "300" {
		t.Fatalf("second denial: %s Retry-After %q, want OVER_LIMIT 300 (block end)", code, retry)
	}
	if diff := cmp.Diff(blockedBody(300), body); diff != "" {
		t.Errorf("problem (-want +got):\n%s", diff)
	}
	if n := metricValue(t, e.reg, "ratelimitd_penalties_total", labels); n != 1 {
		t.Errorf("penalties_total %v, want 1", n)
	}
	e.clock.Advance(2 * time.Minute) // a new window: the limit would admit
	for i := range 3 {
		code, retry, body := call()
		if code != "OVER_LIMIT" || retry != "180" {
			t.Fatalf("blocked request %d: %s Retry-After %q, want OVER_LIMIT 180", i, code, retry)
		}
		if diff := cmp.Diff(blockedBody(180), body); diff != "" {
			t.Errorf("problem (-want +got):\n%s", diff)
		}
	}
	if n := metricValue(t, e.reg, "ratelimitd_penalty_denied_total", labels); n != 3 {
		t.Errorf("penalty_denied_total %v, want 3", n)
	}
	e.clock.Advance(3 * time.Minute) // the block's end
	if code, retry, _ := call(); code != "OK" || retry != "" {
		t.Fatalf("after the block: %s Retry-After %q, want OK", code, retry)
	}
	if n := metricValue(t, e.reg, "ratelimitd_penalties_total", labels); n != 1 {
		t.Errorf("penalties_total %v, want still 1", n)
	}

	for i := range 5 {
		resp := e.call(t, req("pen", d("shadowed", "s")))
		if resp.GetOverallCode() != OK {
			t.Fatalf("shadow-mode request %d: %v", i, resp.GetOverallCode())
		}
	}
	shadow := map[string]string{"domain": "pen", "rule": "pen.shadowed"}
	if n := metricValue(t, e.reg, "ratelimitd_penalties_total", shadow) + metricValue(t, e.reg, "ratelimitd_penalty_denied_total", shadow); n != 0 {
		t.Errorf("a shadow-mode rule counted %v penalties", n)
	}
}

func jsonInt(f float64) string {
	b, _ := json.Marshal(int64(f))
	return string(b)
}
