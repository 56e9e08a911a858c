package deploy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

func TestMain(m *testing.M) { deploytest.Main(m) }

// instance is one running `ratelimitd serve`.
type instance struct {
	http string
	log  *deploytest.SyncBuffer
}

// serve starts ratelimitd with extra flags, waits for /healthcheck 200 and
// stops it at the end of the test.
func serve(t *testing.T, bin, configDir string, extra ...string) instance {
	t.Helper()
	var in instance
	// Fresh ports on each start: one may be taken before ratelimitd binds it.
	err := testproc.StartRetrying("ratelimitd serve", func() error {
		httpAddr := deploytest.FreeAddr(t)
		args := append([]string{"serve", "--config", configDir, "--grpc-addr", deploytest.FreeAddr(t), "--http-addr", httpAddr, "--debug-addr", ""}, extra...)
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no RATELIMITD_* or legacy variables from the caller
		p := deploytest.Start(t, cmd, 20*time.Second)
		in = instance{http: httpAddr, log: p.Log}
		return p.WaitUp(30*time.Second, deploytest.GetOK("http://"+httpAddr+"/healthcheck"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// descriptor is one request descriptor for POST /json.
type descriptor struct {
	Entries []map[string]string `json:"entries"`
}

// exampleDescriptors walks a config file and returns, per domain, one
// request descriptor for every node that holds a limit (wildcards and
// value-less keys filled with a sample value).
func exampleDescriptors(t *testing.T, file string) map[string][]descriptor {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Domain      string `json:"domain"`
		Descriptors []any  `json:"descriptors"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []descriptor
	var walk func(nodes []any, parent []map[string]string)
	walk = func(nodes []any, parent []map[string]string) {
		for _, n := range nodes {
			m, _ := n.(map[string]any)
			key, _ := m["key"].(string)
			val, _ := m["value"].(string)
			if val == "" {
				val = "sample-value"
			}
			val = strings.ReplaceAll(val, "*", "x")
			entries := append(slices.Clone(parent), map[string]string{"key": key, "value": val})
			if m["rate_limit"] != nil || m["rate_limits"] != nil {
				out = append(out, descriptor{Entries: entries})
			}
			if sub, ok := m["descriptors"].([]any); ok {
				walk(sub, entries)
			}
		}
	}
	walk(cfg.Descriptors, nil)
	return map[string][]descriptor{cfg.Domain: out}
}

// rawValue is the sample value every descriptor carries in its last entry
// when the config has a value-less key; it must never show up in a label.
const rawValue = "sample-value"

func postJSON(t *testing.T, in instance, domain string, ds []descriptor) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"domain": domain, "descriptors": ds})
	resp, err := http.Post("http://"+in.http+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /json: %v", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func scrape(t *testing.T, in instance) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + in.http + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

func hasSeries(fams map[string]*dto.MetricFamily, name, label, value string) bool {
	f, ok := fams[name]
	if !ok {
		return false
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return true
			}
		}
	}
	return false
}

// TestMetricsExistInRunningService builds ratelimitd, runs it on the
// shipped example config, causes every kind of event the alerts watch
// (decisions, a rejected config reload, backend errors with fail-open and
// fail-closed rules), and checks every family in `queried` is on /metrics
// with the declared type, exactly the declared labels, and only the
// declared label values; and that no label carries a request value.
func TestMetricsExistInRunningService(t *testing.T) {
	bin := deploytest.Ratelimitd(t)
	example := filepath.Join("..", "examples", "config")
	files, _ := filepath.Glob(filepath.Join(example, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("examples/config holds no config")
	}
	dir := t.TempDir()
	descs := map[string][]descriptor{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
		for d, ds := range exampleDescriptors(t, f) {
			descs[d] = append(descs[d], ds...)
		}
	}
	// A rule whose early warning fires whenever a key passes a quarter of
	// its limit (within: 1 is the whole window), whatever the wall clock's
	// position in the hour: the 12 calls below cross it.
	early := filepath.Join(dir, "zz-early-warning.yaml")
	if err := os.WriteFile(early, []byte("domain: early\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20, early_warning: {used: 0.25, within: 1}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for d, ds := range exampleDescriptors(t, early) {
		descs[d] = append(descs[d], ds...)
	}

	// A: in-memory backend; traffic, then a bad config file.
	a := serve(t, bin, dir, "--backend", "memory")
	sent := 0
	for domain, ds := range descs {
		for _, d := range ds {
			// Enough calls per descriptor to pass small limits: ok,
			// near_limit, over_limit and shadow decisions all occur.
			for range 12 {
				if code := postJSON(t, a, domain, []descriptor{d}); code != 200 && code != 429 {
					t.Errorf("POST /json %s %v: status %d", domain, d, code)
				}
				sent++
			}
		}
	}
	if sent == 0 {
		t.Fatal("the example config yields no descriptor to send")
	}
	if err := os.WriteFile(filepath.Join(dir, "zz-broken.yaml"), []byte("domain: broken\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var famsA map[string]*dto.MetricFamily
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		famsA = scrape(t, a)
		if hasSeries(famsA, "ratelimitd_config_reloads_total", "result", "failure") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no ratelimitd_config_reloads_total{result=\"failure\"} 15s after writing a broken config file:\n%s", a.log)
			break
		}
	}

	// B: Redis backend on a port where nothing listens: every call is a
	// backend error, answered by the rules' failure modes.
	b := serve(t, bin, example, "--backend", "redis", "--redis-url", "redis://"+deploytest.FreeAddr(t)+"/0", "--redis-timeout", "50ms")
	for domain, ds := range descs {
		for _, d := range ds {
			postJSON(t, b, domain, []descriptor{d})
		}
	}
	famsB := scrape(t, b)

	union := map[string][]*dto.MetricFamily{}
	for _, fams := range []map[string]*dto.MetricFamily{famsA, famsB} {
		for n, f := range fams {
			union[n] = append(union[n], f)
		}
	}
	for _, want := range queried {
		got, ok := union[want.Name]
		if !ok {
			t.Errorf("%s: not on /metrics of a running ratelimitd (after traffic, a failed reload and backend errors)", want.Name)
			continue
		}
		for _, f := range got {
			if typ := strings.ToLower(f.GetType().String()); typ != want.Type {
				t.Errorf("%s: type %s, want %s", want.Name, typ, want.Type)
			}
			seen := map[string]map[string]bool{}
			for _, m := range f.GetMetric() {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, l.GetName())
					if seen[l.GetName()] == nil {
						seen[l.GetName()] = map[string]bool{}
					}
					seen[l.GetName()][l.GetValue()] = true
				}
				sort.Strings(ls)
				wl := slices.Sorted(slices.Values(want.Labels))
				if !slices.Equal(ls, wl) {
					t.Errorf("%s: series labels %v, the rules expect %v", want.Name, ls, wl)
				}
			}
			for l, allowed := range want.Values {
				for v := range seen[l] {
					if !slices.Contains(allowed, v) {
						t.Errorf("%s{%s=%q}: value not in the list the rules assume %v (update queried in rules_test.go and the rules)", want.Name, l, v, allowed)
					}
				}
			}
		}
	}
	// Events the alerts watch really produce the label values they select.
	for _, c := range []struct {
		fams         map[string]*dto.MetricFamily
		name, l, val string
	}{
		{famsA, "ratelimitd_decisions_total", "result", "ok"},
		{famsA, "ratelimitd_config_reloads_total", "result", "success"},
		{famsA, "ratelimitd_early_warning_total", "rule", "early.k"},
		{famsB, "ratelimitd_decisions_total", "result", "failed_open"},
		{famsB, "ratelimitd_decisions_total", "result", "failed_closed"},
	} {
		if !hasSeries(c.fams, c.name, c.l, c.val) {
			t.Errorf("%s{%s=%q} missing after the event that should produce it", c.name, c.l, c.val)
		}
	}
	if f, ok := famsB["ratelimitd_backend_errors_total"]; !ok || len(f.GetMetric()) == 0 {
		t.Errorf("ratelimitd_backend_errors_total has no series after calls to a dead Redis:\n%s", b.log)
	}
	// No request value in any label (contract: labels never carry raw
	// descriptor values).
	for _, fams := range []map[string]*dto.MetricFamily{famsA, famsB} {
		for n, f := range fams {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if strings.Contains(l.GetValue(), rawValue) {
						t.Errorf("%s{%s=%q}: a request value reached a label", n, l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
	if t.Failed() {
		t.Logf("ratelimitd A log:\n%s", a.log)
	}
}
