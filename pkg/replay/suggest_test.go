package replay

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// memoryStores is SuggestOptions.NewStore on the memory store.
func memoryStores(now func() time.Time) (service.Store, func(), error) {
	st, err := memory.New(memory.Options{Now: now, SweepInterval: -1})
	if err != nil {
		return nil, nil, err
	}
	return st, func() { _ = st.Close() }, nil
}

// synthetic is a log of legitimate keys with a known distribution of peaks
// plus injected scanners, and the config it is replayed with.
type synthetic struct {
	lines   []LogLine
	peaks   map[string]int64 // legitimate client -> its requests in its one busy minute
	abusive map[string]bool  // scanner clients
	config  string           // path of the config file
	mean    float64          // of the exponential distribution of peaks
}

const syntheticConfig = `domain: small
descriptors:
  - key: remote_address
    rate_limit:
      name: per-ip
      unit: minute
      requests_per_unit: 600
`

// newSynthetic builds 1000 legitimate clients whose peaks per minute are
// the quantiles of an exponential distribution of mean 10 (client i sends
// ceil(F^-1((i+0.5)/1000)) requests within one minute, spread over 25 hours
// of log), two scanners the current limit (600/minute, fixed window) denies
// in 3 windows each, and two scanners under the current limit but far above
// the legitimate keys (550 in a minute).
func newSynthetic(t *testing.T) *synthetic {
	t.Helper()
	s := &synthetic{peaks: map[string]int64{}, abusive: map[string]bool{}, mean: 10}
	start := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	n := 0
	add := func(client netip.Addr, minute int, count int64) {
		for j := range count {
			n++
			s.lines = append(s.lines, LogLine{Line: n, Time: start.Add(time.Duration(minute)*time.Minute + time.Duration(j*7%60)*time.Second),
				Client: client, Method: "GET", Target: "/x", Proto: "HTTP/1.1", Status: 200})
		}
	}
	const keys = 1000
	for i := range keys {
		q := (float64(i) + 0.5) / keys
		peak := int64(math.Ceil(-s.mean * math.Log(1-q)))
		c := netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i % 256)})
		s.peaks[c.String()] = peak
		add(c, i*37%1500, peak)
	}
	for i := range 2 {
		c := netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
		s.abusive[c.String()] = true
		for m := range 3 {
			add(c, 100+i*300+m*120, 650)
		}
	}
	for i := range 2 {
		c := netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})
		s.abusive[c.String()] = true
		add(c, 700+i*5, 550)
	}
	s.config = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(s.config, []byte(syntheticConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *synthetic) options(t *testing.T, cfg string) Options {
	t.Helper()
	e, err := LoadEnvoy("testdata/small-envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := policy.Load(policy.LoadOptions{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return replayOptions(t, e, set)
}

// TestSuggestSynthetic: the suggestion lands within 10 % of 2.5 × the
// analytic p99 of the legitimate distribution, the four scanners are set
// aside with their reasons, and each candidate's counts match both the
// analytic count of a fixed window and a direct replay of that limit from
// the printed fragment.
func TestSuggestSynthetic(t *testing.T) {
	s := newSynthetic(t)
	rep, err := Suggest(context.Background(), s.lines, nil, s.options(t, s.config), SuggestOptions{NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	sg := rep.Suggestion
	if sg == nil || len(sg.Classes) != 1 {
		t.Fatalf("suggestion %+v: want one class", sg)
	}
	c := sg.Classes[0]
	if c.Keys != 1004 || c.Legitimate != 1000 || c.AbusiveKeys != 4 {
		t.Fatalf("keys %d legitimate %d abusive %d, want 1004/1000/4", c.Keys, c.Legitimate, c.AbusiveKeys)
	}
	for _, a := range c.Abusive {
		client := strings.TrimPrefix(a.Key, "remote_address=")
		if !s.abusive[client] {
			t.Errorf("set aside %s (%s), a legitimate key", a.Key, a.Reason)
		}
		switch {
		case strings.HasPrefix(client, "203.0.113.") && !strings.Contains(a.Reason, "denied it in 3 windows"):
			t.Errorf("%s: reason %q, want denied in 3 windows", client, a.Reason)
		case strings.HasPrefix(client, "198.51.100.") && !strings.Contains(a.Reason, "above 10× the p99"):
			t.Errorf("%s: reason %q, want the outlier bound", client, a.Reason)
		}
	}
	wantP99 := -s.mean * math.Log(0.01)
	want := 2.5 * wantP99
	if math.Abs(float64(c.Suggested)-want) > 0.1*want {
		t.Errorf("suggested %d, want within 10%% of %.1f (2.5 × the analytic p99 %.2f)", c.Suggested, want, wantP99)
	}
	// Nearest rank of 1000 stratified quantiles: the p-th percentile is
	// the key of rank ceil(p*1000), at quantile (rank-0.5)/1000.
	rank := func(p float64) int64 {
		q := (math.Ceil(p*1000) - 0.5) / 1000
		return int64(math.Ceil(-s.mean * math.Log(1-q)))
	}
	if c.Peaks.P50 != rank(0.5) || c.Peaks.P95 != rank(0.95) || c.Peaks.P99 != rank(0.99) || c.Peaks.P999 != rank(0.999) || c.Peaks.Max != rank(1) {
		t.Errorf("peaks %+v, want p50 %d p95 %d p99 %d p99.9 %d max %d", c.Peaks, rank(0.5), rank(0.95), rank(0.99), rank(0.999), rank(1))
	}
	for _, f := range c.Flags {
		if strings.Contains(f, "log time") || strings.Contains(f, "legitimate keys") {
			t.Errorf("flag %q on 25 h and 1000 keys", f)
		}
	}
	// Burst: 20 % of the per-minute rate (the busiest second of a key
	// here holds at most 3 requests: j*7 mod 60 spreads 60 per minute).
	if wantBurst := int64(math.Ceil(0.2 * float64(c.Suggested))); c.Burst != wantBurst {
		t.Errorf("burst %d, want %d", c.Burst, wantBurst)
	}
	if len(c.Candidates) != 6 || len(sg.Fragments) != 1 {
		t.Fatalf("%d candidates, %d fragments; want 6 and 1", len(c.Candidates), len(sg.Fragments))
	}
	frag := sg.Fragments[0].YAML
	if !strings.Contains(frag, "shadow_mode: true") || !strings.Contains(frag, fmt.Sprintf("requests_per_unit: %d", c.Suggested)) {
		t.Fatalf("fragment lacks the suggestion or shadow_mode:\n%s", frag)
	}
	var legitLines []LogLine
	for _, l := range s.lines {
		if !s.abusive[l.Client.String()] {
			legitLines = append(legitLines, l)
		}
	}
	for _, k := range c.Candidates {
		// Fixed window, one busy minute per legitimate key: a limit L
		// denies max(0, peak-L) of its requests.
		var denied, keys int
		for _, p := range s.peaks {
			if p > k.Limit {
				denied += int(p - k.Limit)
				keys++
			}
		}
		if k.LegitDenied != denied || k.LegitKeysDenied != keys {
			t.Errorf("%s (%d): legit denied %d keys %d, analytic %d keys %d", k.Name, k.Limit, k.LegitDenied, k.LegitKeysDenied, denied, keys)
		}
		// Direct replay of the fragment with this candidate's limit.
		cfg := strings.Replace(frag, fmt.Sprintf("requests_per_unit: %d", c.Suggested), fmt.Sprintf("requests_per_unit: %d", k.Limit), 1)
		path := filepath.Join(t.TempDir(), "candidate.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		all, err := RunLines(context.Background(), s.lines, nil, s.options(t, path))
		if err != nil {
			t.Fatal(err)
		}
		legit, err := RunLines(context.Background(), legitLines, nil, s.options(t, path))
		if err != nil {
			t.Fatal(err)
		}
		ra, rl := rule(t, all, "per-ip"), rule(t, legit, "per-ip")
		if ra.Shadow != k.Denied || rl.Shadow != k.LegitDenied || ra.Shadow-rl.Shadow != k.AbusiveDenied {
			t.Errorf("%s (%d): printed denied %d legit %d abusive %d; direct replay %d, legit %d, abusive %d",
				k.Name, k.Limit, k.Denied, k.LegitDenied, k.AbusiveDenied, ra.Shadow, rl.Shadow, ra.Shadow-rl.Shadow)
		}
		if share := float64(rl.Shadow) / float64(len(legitLines)); share != k.LegitShare {
			t.Errorf("%s: printed legit share %v, direct replay %v", k.Name, k.LegitShare, share)
		}
		if ra.Denied != 0 || all.Denied != 0 {
			t.Errorf("%s: the fragment denied %d requests: it must be shadow only", k.Name, all.Denied)
		}
	}
	if c.Candidates[0].Name != "current" || c.Candidates[0].Limit != 600 || c.Candidates[0].AbusiveDenied != 2*3*50 {
		t.Errorf("current candidate %+v: want limit 600 stopping 300 scanner requests", c.Candidates[0])
	}
}

// TestSuggestRefusesFewKeys: a class with fewer legitimate keys than
// MinKeys gets no suggestion, says why, and no config is printed when no
// rule got one; a short log is flagged.
func TestSuggestRefusesFewKeys(t *testing.T) {
	s := newSynthetic(t)
	var few []LogLine
	for _, l := range s.lines {
		if b := l.Client.As4(); b[0] == 10 && b[3] < 15 && b[2] == 0 {
			few = append(few, l)
		}
	}
	rep, err := Suggest(context.Background(), few, nil, s.options(t, s.config), SuggestOptions{NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Suggestion.Classes[0]
	if c.Legitimate != 15 || c.Suggested != 0 || !strings.Contains(c.Refused, "only 15 legitimate keys") || len(c.Candidates) != 0 {
		t.Fatalf("class %+v: want a refusal on 15 keys", c)
	}
	if len(rep.Suggestion.Fragments) != 0 {
		t.Errorf("a config without any suggested limit: %+v", rep.Suggestion.Fragments)
	}
	var short []LogLine
	for _, l := range s.lines {
		if l.Time.Before(s.lines[0].Time.Add(10 * time.Hour)) {
			short = append(short, l)
		}
	}
	rep, err = Suggest(context.Background(), short, nil, s.options(t, s.config), SuggestOptions{MinKeys: 5, NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	if fl := strings.Join(rep.Suggestion.Classes[0].Flags, "; "); !strings.Contains(fl, "of log time (less than 24h0m0s)") {
		t.Errorf("flags %q: want the short-log flag", fl)
	}
}

// TestSuggestRuleToWrite: for an unlimited rule (a limit still to be
// written) the suggestion gives the minute, hour and day distributions and
// limits, sets the scanners aside by the outlier bound alone (no current
// limit denies them), replays no candidate and leaves the rule unchanged.
func TestSuggestRuleToWrite(t *testing.T) {
	s := newSynthetic(t)
	cfg := filepath.Join(t.TempDir(), "unlimited.yaml")
	if err := os.WriteFile(cfg, []byte("domain: small\ndescriptors:\n  - key: remote_address\n    rate_limit: {unlimited: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Suggest(context.Background(), s.lines, nil, s.options(t, cfg), SuggestOptions{NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Suggestion.Classes[0]
	if c.Current != "unlimited" || c.Legitimate != 1000 || c.AbusiveKeys != 4 || len(c.Candidates) != 0 || len(c.Windows) != 3 {
		t.Fatalf("class %+v: want 1000 legitimate keys, 4 set aside, 3 windows, no candidates", c)
	}
	want := 2.5 * -s.mean * math.Log(0.01)
	for _, w := range c.Windows {
		// Each legitimate key is busy in one minute only: its hour and
		// day peaks are its minute peak.
		if w.Peaks != c.Peaks || math.Abs(float64(w.Suggested)-want) > 0.1*want {
			t.Errorf("window %s: peaks %+v suggested %d, want %+v and within 10%% of %.1f", time.Duration(w.Window), w.Peaks, w.Suggested, c.Peaks, want)
		}
	}
	for _, a := range c.Abusive {
		if !strings.Contains(a.Reason, "above 10× the p99") {
			t.Errorf("%s set aside for %q", a.Key, a.Reason)
		}
	}
	for _, f := range rep.Suggestion.Fragments {
		if strings.Contains(f.YAML, "suggested by") {
			t.Errorf("fragment rewrites the unlimited rule:\n%s", f.YAML)
		}
	}
}

// TestReplayQuietEarlyWarnings: a replay writes none of the service's
// early-warning log lines (sampled per second of log time, they would be
// one per crossing key), while other service lines still pass.
func TestReplayQuietEarlyWarnings(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(prev)
	s := newSynthetic(t)
	cfg := filepath.Join(t.TempDir(), "early.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(syntheticConfig, "requests_per_unit: 600", "requests_per_unit: 600\n      early_warning: {used: 0.1, within: 1}", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The scanners (650 and 550 in a minute) cross 60 of 600.
	opts := s.options(t, cfg)
	if _, err := RunLines(context.Background(), s.lines, nil, opts); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "early warning") {
		t.Errorf("replay logged early warnings:\n%.500s", buf.String())
	}
	h := quietHandler{slog.Default().Handler()}
	_ = h.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelWarn, "backend error", 0))
	if !strings.Contains(buf.String(), "backend error") {
		t.Errorf("quietHandler dropped another line: %q", buf.String())
	}
}
