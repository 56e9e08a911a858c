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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
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

const twoLimitConfig = `domain: small
descriptors:
  - key: remote_address
    rate_limits:
      - name: per-ip-second
        unit: second
        requests_per_unit: 10
      - name: per-ip-minute
        unit: minute
        requests_per_unit: 300
`

// denialCounter is a Store that counts the denied decisions per hit key.
type denialCounter struct {
	service.Store
	mu     sync.Mutex
	denied map[string]int
}

func (d *denialCounter) Take(ctx context.Context, hits []algo.Hit, ds []algo.Decision) error {
	err := d.Store.Take(ctx, hits, ds)
	if err == nil {
		d.mu.Lock()
		for i, h := range hits {
			if i < len(ds) && !ds[i].Allowed {
				d.denied[h.Key]++
			}
		}
		d.mu.Unlock()
	}
	return err
}

// TestSuggestEveryLimit: a rule with two limits (10/second and 300/minute)
// gets a suggestion per limit, each on the distribution of its own window;
// the fragment rewrites both limits; and for every candidate, a direct
// replay of the fragment with both limits set to that candidate counts, per
// limit, exactly the printed denials and false-positive rate.
func TestSuggestEveryLimit(t *testing.T) {
	s := newSynthetic(t)
	cfg := filepath.Join(t.TempDir(), "two.yaml")
	if err := os.WriteFile(cfg, []byte(twoLimitConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Suggest(context.Background(), s.lines, nil, s.options(t, cfg), SuggestOptions{NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	sg := rep.Suggestion
	if sg == nil || len(sg.Classes) != 2 || len(sg.Fragments) != 1 {
		t.Fatalf("suggestion %+v: want two classes and one fragment", sg)
	}
	sec, perMin := sg.Classes[0], sg.Classes[1]
	if sec.Limit != 0 || perMin.Limit != 1 || sec.Of != 2 || perMin.Of != 2 ||
		time.Duration(sec.Window) != time.Second || time.Duration(perMin.Window) != time.Minute {
		t.Fatalf("classes %d/%d of %d/%d windows %s/%s: want limits 0 and 1 of 2, 1s and 1m0s",
			sec.Limit, perMin.Limit, sec.Of, perMin.Of, time.Duration(sec.Window), time.Duration(perMin.Window))
	}
	// The log spreads a key's busy minute over distinct seconds (j*7 mod
	// 60): its busiest second holds ceil(peak/60) requests.
	var secPeaks, minPeaks []int64
	for _, p := range s.peaks {
		secPeaks = append(secPeaks, (p+59)/60)
		minPeaks = append(minPeaks, p)
	}
	slices.Sort(secPeaks)
	slices.Sort(minPeaks)
	if perMin.Legitimate != 1000 || perMin.Peaks != distribution(minPeaks) {
		t.Errorf("per-minute: legitimate %d peaks %+v, want 1000 and %+v", perMin.Legitimate, perMin.Peaks, distribution(minPeaks))
	}
	if want := percentile(secPeaks, 0.99); sec.Peaks.P99 != want {
		t.Errorf("per-second p99 %d, want %d", sec.Peaks.P99, want)
	}
	for _, c := range []ClassSuggestion{sec, perMin} {
		if want := int64(math.Ceil(2.5 * float64(c.Peaks.P99))); c.Suggested != want || len(c.Candidates) != 6 {
			t.Fatalf("limit %d: suggested %d (want %d), %d candidates (want 6)", c.Limit, c.Suggested, want, len(c.Candidates))
		}
		if c.Candidates[2].Name != "1x p99" || c.Candidates[2].LegitDenied == 0 {
			t.Errorf("limit %d: candidate %+v denies no legitimate request: the check below would be vacuous", c.Limit, c.Candidates[2])
		}
	}
	var txt bytes.Buffer
	if err := sg.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"window 1s, limit 1 of 2)", "window 1m0s, limit 2 of 2)"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, txt.String())
		}
	}
	frag := sg.Fragments[0].YAML
	var doc struct {
		Domain      string `yaml:"domain"`
		Descriptors []struct {
			Key        string           `yaml:"key"`
			ShadowMode bool             `yaml:"shadow_mode"`
			RateLimits []map[string]any `yaml:"rate_limits"`
		} `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal([]byte(frag), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Descriptors) != 1 || !doc.Descriptors[0].ShadowMode || len(doc.Descriptors[0].RateLimits) != 2 {
		t.Fatalf("fragment:\n%s\nwant one descriptor in shadow mode with two limits", frag)
	}
	rls := doc.Descriptors[0].RateLimits
	if rls[0]["requests_per_unit"] != int(sec.Suggested) || rls[1]["requests_per_unit"] != int(perMin.Suggested) {
		t.Fatalf("fragment limits %v / %v, want %d / %d:\n%s", rls[0]["requests_per_unit"], rls[1]["requests_per_unit"], sec.Suggested, perMin.Suggested, frag)
	}
	if n := strings.Count(frag, "suggested by ratelimitd replay --suggest"); n != 2 {
		t.Errorf("fragment has %d comments on the changed limits, want 2:\n%s", n, frag)
	}
	legitOf := func(c ClassSuggestion) map[string]bool {
		aside := map[string]bool{}
		for _, a := range c.Abusive {
			aside[strings.TrimPrefix(a.Key, "remote_address=")] = true
		}
		if len(aside) != c.AbusiveKeys {
			t.Fatalf("limit %d: %d keys set aside, %d listed", c.Limit, c.AbusiveKeys, len(aside))
		}
		legit := map[string]bool{}
		for _, l := range s.lines {
			if c := l.Client.String(); !aside[c] {
				legit[c] = true
			}
		}
		return legit
	}
	legit := []map[string]bool{legitOf(sec), legitOf(perMin)}
	reqs := map[string]int{}
	for _, l := range s.lines {
		reqs[l.Client.String()]++
	}
	for ci := range sec.Candidates {
		// The fragment with both limits set to candidate ci, replayed.
		rls[0]["requests_per_unit"], rls[1]["requests_per_unit"] = sec.Candidates[ci].Limit, perMin.Candidates[ci].Limit
		data, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "candidate.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		opts := s.options(t, path)
		dc := &denialCounter{Store: opts.Store, denied: map[string]int{}}
		opts.Store = dc
		direct, err := RunLines(context.Background(), s.lines, nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		if direct.Denied != 0 {
			t.Errorf("candidate %d: the fragment denied %d requests: it must be shadow only", ci, direct.Denied)
		}
		for k, c := range []ClassSuggestion{sec, perMin} {
			var denied, legitDenied, legitReq int
			for client := range reqs {
				m, ok := opts.Policy.Match("small", []policy.Entry{{Key: "remote_address", Value: client}})
				if !ok {
					t.Fatalf("%s matches no rule", client)
				}
				n := dc.denied[opts.Policy.Key(m, k)]
				denied += n
				if legit[k][client] {
					legitDenied += n
					legitReq += reqs[client]
				}
			}
			p := c.Candidates[ci]
			if p.Denied != denied || p.LegitDenied != legitDenied || p.LegitShare != float64(legitDenied)/float64(legitReq) {
				t.Errorf("limit %d candidate %s (%d): printed denied %d legit %d share %v; direct replay %d, legit %d, share %v",
					k, p.Name, p.Limit, p.Denied, p.LegitDenied, p.LegitShare, denied, legitDenied, float64(legitDenied)/float64(legitReq))
			}
		}
	}
}
