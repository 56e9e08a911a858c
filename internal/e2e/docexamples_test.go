package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// docRequest is one example request of the docs: its JSON body and where
// the doc sends it.
type docRequest struct {
	file, body, target string
}

// docRequestRE finds `curl -s -d '<json>' <target>` and `grpcurl
// -plaintext -d '<json>' <host:port> <method>` examples, the target on
// the same line or the next after a backslash.
var docRequestRE = regexp.MustCompile(`-d '(\{[^']*\})'\s*(?:\\\n\s*)?(\S+(?: \S+/\S+)?)`)

func docRequests(t *testing.T, files ...string) []docRequest {
	t.Helper()
	var out []docRequest
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docRequestRE.FindAllStringSubmatch(string(b), -1) {
			out = append(out, docRequest{file: f, body: m[1], target: m[2]})
		}
	}
	return out
}

// TestDocAdminExamples: the admin and troubleshooting examples run as
// written against the config `make run` serves (examples/config): every
// request's domain is loaded and every descriptor matches a rule, and the
// explanation docs/admin.md shows is what six attempts of the same user
// produce (times aside).
func TestDocAdminExamples(t *testing.T) {
	reqs := docRequests(t, "docs/admin.md", "docs/troubleshooting.md")
	if len(reqs) < 5 {
		t.Fatalf("found %d example requests in the docs: %+v", len(reqs), reqs)
	}
	p := start(t, startOpts{args: []string{"--config", filepath.Join(repoRoot(t), "examples/config"), "--backend", "memory"}})
	p.waitServing(t, p.dial(t), "envoy.service.ratelimit.v3.RateLimitService")

	// The target as the doc names it -> the URL on this process (gRPC
	// methods through their HTTP twins: POST /json and the admin paths).
	url := func(target string) string {
		switch {
		case strings.HasSuffix(target, "/admin/explain"):
			return "http://" + p.debug + "/admin/explain"
		case strings.HasSuffix(target, "/admin/reset"), strings.HasSuffix(target, "Admin/Reset"):
			return "http://" + p.debug + "/admin/reset"
		case strings.HasSuffix(target, "Admin/Explain"):
			return "http://" + p.debug + "/admin/explain"
		case strings.HasSuffix(target, "RateLimitService/ShouldRateLimit"), strings.HasSuffix(target, "/json"):
			return "http://" + p.http + "/json"
		}
		t.Fatalf("example target %q: not an admin call nor ShouldRateLimit", target)
		return ""
	}
	for _, r := range reqs {
		code, body := httpPost(t, url(r.target), r.body)
		if code != 200 {
			t.Errorf("%s: %s to %s: %d %s", r.file, r.body, r.target, code, body)
			continue
		}
		var m struct {
			Descriptors []struct {
				Matched bool `json:"matched"`
			} `json:"descriptors"`
			Counters []any `json:"counters"`
			Statuses []struct {
				CurrentLimit any `json:"currentLimit"`
			} `json:"statuses"`
		}
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%s: %s: %v", r.file, body, err)
		}
		switch u := url(r.target); {
		case strings.HasSuffix(u, "/admin/explain"):
			for i, d := range m.Descriptors {
				if !d.Matched {
					t.Errorf("%s: explain %s: descriptor %d matches no rule of examples/config", r.file, r.body, i)
				}
			}
		case strings.HasSuffix(u, "/admin/reset"):
			if len(m.Counters) == 0 {
				t.Errorf("%s: reset %s deletes no counter: %s", r.file, r.body, body)
			}
		default:
			for i, st := range m.Statuses {
				if st.CurrentLimit == nil {
					t.Errorf("%s: ShouldRateLimit %s: descriptor %d has no limit: %s", r.file, r.body, i, body)
				}
			}
		}
	}

	// docs/admin.md's explanation: the first explain example after six
	// attempts, against the JSON the doc shows.
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/admin.md"))
	if err != nil {
		t.Fatal(err)
	}
	var ex docRequest
	for _, r := range reqs {
		if r.file == "docs/admin.md" && strings.HasSuffix(r.target, "/admin/explain") {
			ex = r
			break
		}
	}
	if ex.body == "" {
		t.Fatal("docs/admin.md has no explain example")
	}
	shown := regexp.MustCompile("(?s)```json\n(\\{\n  \"domain\".*?)```").FindSubmatch(doc)
	if shown == nil {
		t.Fatal("docs/admin.md shows no explanation")
	}
	if code, body := httpPost(t, "http://"+p.debug+"/admin/reset", ex.body); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	for range 6 {
		httpPost(t, "http://"+p.http+"/json", ex.body)
	}
	_, got := httpPost(t, url(ex.target), ex.body)
	var want, have map[string]any
	if err := json.Unmarshal(shown[1], &want); err != nil {
		t.Fatalf("docs/admin.md's explanation: %v\n%s", err, shown[1])
	}
	if err := json.Unmarshal([]byte(got), &have); err != nil {
		t.Fatal(err)
	}
	// Times depend on when the test runs; both are set and positive.
	for _, m := range []map[string]any{want, have} {
		for _, d := range m["descriptors"].([]any) {
			for _, l := range d.(map[string]any)["limits"].([]any) {
				lim := l.(map[string]any)
				for _, k := range []string{"reset_after_seconds", "retry_after_seconds"} {
					if v, ok := lim[k].(float64); !ok || v <= 0 {
						t.Errorf("%s = %v, want a positive number", k, lim[k])
					}
					lim[k] = "time"
				}
			}
		}
	}
	if d := cmp.Diff(want, have); d != "" {
		t.Errorf("docs/admin.md's explanation differs from the answer after six attempts (-doc +got):\n%s", d)
	}
}
