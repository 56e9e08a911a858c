package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func smallOptions(t *testing.T) Options {
	t.Helper()
	e, err := LoadEnvoy("testdata/small-envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := policy.Load(policy.LoadOptions{}, "testdata/small.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return replayOptions(t, e, set)
}

func runSmall(t *testing.T, opts Options) *Report {
	t.Helper()
	f, err := os.Open("testdata/small.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := Run(context.Background(), f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func rule(t *testing.T, rep *Report, name string) RuleStats {
	t.Helper()
	for _, r := range rep.Rules {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule %q in %+v", name, rep.Rules)
	return RuleStats{}
}

// TestRunSmall: the expected numbers are worked out by hand in
// testdata/small.log order: per-ip allows 2 per epoch minute, heavy-shadow
// 1 per minute in shadow mode.
func TestRunSmall(t *testing.T) {
	tests := []struct {
		order      Order
		deniedPath string
	}{
		// Sorted: /b(:01) /c(:03) /heavy(:04) /a(:05) -> /a is the 3rd of 192.0.2.1.
		{OrderTime, "/a"},
		// File order with a monotonic clock: /a /b /c -> /c is the 3rd.
		{OrderFile, "/c"},
	}
	for _, tc := range tests {
		t.Run(string(tc.order), func(t *testing.T) {
			opts := smallOptions(t)
			opts.Order = tc.order
			rep := runSmall(t, opts)
			if rep.Lines != 9 || rep.Malformed != 2 || rep.MalformedLines[0].Line != 4 || rep.MalformedLines[1].Line != 9 {
				t.Errorf("lines %d malformed %d %+v", rep.Lines, rep.Malformed, rep.MalformedLines)
			}
			if rep.Requests != 7 || rep.Allowed != 4 || rep.Denied != 1 || rep.ShadowDenied != 1 || rep.NotChecked != 1 {
				t.Errorf("requests %d allowed %d denied %d shadow %d not checked %d",
					rep.Requests, rep.Allowed, rep.Denied, rep.ShadowDenied, rep.NotChecked)
			}
			if rep.Requests != rep.Allowed+rep.Denied+rep.ShadowDenied+rep.NotChecked {
				t.Error("request counts do not add up")
			}
			ip := rule(t, rep, "per-ip")
			if ip.Allowed != 5 || ip.Denied != 1 || ip.Shadow != 0 {
				t.Errorf("per-ip %+v", ip)
			}
			heavy := rule(t, rep, "heavy-shadow")
			if heavy.Allowed != 1 || heavy.Denied != 0 || heavy.Shadow != 1 || !heavy.ShadowMode {
				t.Errorf("heavy-shadow %+v", heavy)
			}
			if rep.Descriptors != ip.Allowed+ip.Denied+ip.Shadow+heavy.Allowed+heavy.Denied+heavy.Shadow+rep.Unmatched {
				t.Error("descriptor counts do not add up")
			}
			if len(rep.TopDeniedPaths) != 2 || rep.TopDeniedPaths[0].Key != tc.deniedPath || rep.TopDeniedPaths[0].Denied != 1 {
				t.Errorf("top denied paths %+v", rep.TopDeniedPaths)
			}
			if len(rep.TopDeniedClients) != 2 || rep.TopDeniedClients[0].Key != "192.0.2.1" || rep.TopDeniedClients[1].Key != "2001:db8::7" || rep.TopDeniedClients[1].Shadow != 1 {
				t.Errorf("top denied clients %+v", rep.TopDeniedClients)
			}
			if len(rep.Minutes) != 2 || rep.Minutes[0].Requests != 5 || rep.Minutes[0].Denied != 1 || rep.Minutes[0].Shadow != 1 {
				t.Fatalf("minutes %+v", rep.Minutes)
			}
			b := rep.Minutes[0].Busiest[0]
			if b.Client != "192.0.2.1" || b.Requests != 3 || b.Denied != 1 || b.MinRemaining != 0 || !strings.Contains(b.Limit, "per-ip 2/minute") {
				t.Errorf("busiest %+v", b)
			}
		})
	}
}

// TestRunGlobalShadowMode: with ShadowMode every over-limit request is
// reported as shadow-denied and none is denied.
func TestRunGlobalShadowMode(t *testing.T) {
	opts := smallOptions(t)
	opts.ShadowMode = true
	rep := runSmall(t, opts)
	if rep.Denied != 0 || rep.ShadowDenied != 2 || rep.Allowed != 4 {
		t.Errorf("allowed %d denied %d shadow %d", rep.Allowed, rep.Denied, rep.ShadowDenied)
	}
	if ip := rule(t, rep, "per-ip"); ip.Shadow != 1 || ip.Denied != 0 {
		t.Errorf("per-ip %+v", ip)
	}
}

// TestRunDeterministicAndOutputs: two runs on the same log give identical
// JSON, text and HTML reports, and the JSON reads back.
func TestRunDeterministicAndOutputs(t *testing.T) {
	var outs [2][3]bytes.Buffer
	for i := range outs {
		rep := runSmall(t, smallOptions(t))
		if err := rep.WriteJSON(&outs[i][0]); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteText(&outs[i][1]); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteHTML(&outs[i][2]); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 3 {
		if !bytes.Equal(outs[0][k].Bytes(), outs[1][k].Bytes()) {
			t.Errorf("output %d differs between identical runs", k)
		}
	}
	var back Report
	if err := json.Unmarshal(outs[0][0].Bytes(), &back); err != nil || back.Requests != 7 {
		t.Errorf("json: %v, requests %d", err, back.Requests)
	}
	text := outs[0][1].String()
	for _, want := range []string{"denied (429):", "14.29%", "per-ip", "heavy-shadow", "192.0.2.1", "4, 9"} {
		if !strings.Contains(text, want) {
			t.Errorf("text report lacks %q:\n%s", want, text)
		}
	}
	page := outs[0][2].String()
	if !strings.Contains(page, "<svg") || strings.Contains(page, "<script") || strings.Contains(page, "http://") && !strings.Contains(page, `xmlns="http://www.w3.org/2000/svg"`) {
		t.Error("html page: want an inline svg, no script")
	}
	// The SVG must be well-formed XML on its own.
	start, end := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	d := xml.NewDecoder(strings.NewReader(page[start : end+len("</svg>")]))
	for {
		if _, err := d.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Errorf("svg: %v", err)
			}
			break
		}
	}
}

// TestOptionsValidate: Validate refuses empty options, an unknown order
// and a negative speed.
func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err == nil {
		t.Error("empty options accepted")
	}
	opts := smallOptions(t)
	opts.Order = "random"
	if err := opts.Validate(); err == nil {
		t.Error("unknown order accepted")
	}
	opts.Order, opts.Speed = OrderTime, -1
	if err := opts.Validate(); err == nil {
		t.Error("negative speed accepted")
	}
}

// TestRunSpeedCancels: a paced replay returns an error when its context is
// canceled.
func TestRunSpeedCancels(t *testing.T) {
	opts := smallOptions(t)
	opts.Speed = 1 // real time: the small log spans a minute
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f, err := os.Open("testdata/small.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Run(ctx, f, opts); err == nil {
		t.Error("cancelled replay returned no error")
	}
}

// TestRunSpeedPaces checks --speed: the small log spans 62 s of log time, so
// at 620 times real time the replay cannot finish in less than 100 ms.
func TestRunSpeedPaces(t *testing.T) {
	opts := smallOptions(t)
	opts.Speed = 620
	start := time.Now()
	rep := runSmall(t, opts)
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("replay at speed 620 took %v, want at least 100ms", el)
	}
	if rep.Requests != 7 || rep.Denied != 1 {
		t.Errorf("paced replay decided differently: %+v", rep)
	}
}
