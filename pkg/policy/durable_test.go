package policy

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// A `store: durable` limit loads only when a durable store is configured,
// with a window of an hour or longer and an algorithm the durable store
// decides; each refusal is at the `store:` line. The fast backend's
// algorithm restriction does not apply to durable limits, and the
// durable store's does not apply to the others.
func TestLoadDurableStore(t *testing.T) {
	good := head +
		"  - key: day\n    rate_limit: {unit: day, requests_per_unit: 5, store: durable}\n" +
		"  - key: month\n    rate_limit: {unit: month, calendar: true, requests_per_unit: 100, store: durable, algorithm: sliding_window}\n" +
		"  - key: hour\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {unit: hour, requests_per_unit: 500, store: durable}\n" +
		"  - key: fast\n    rate_limit: {unit: minute, requests_per_unit: 5, store: fast}\n"
	durable := DurableOptions{Enabled: true, Algorithms: []algo.Kind{algo.FixedWindow, algo.SlidingWindow}}
	opts := LoadOptions{Algorithms: []algo.Kind{algo.FixedWindow}, Backend: "memcache", Durable: durable}
	dir := writeFiles(t, map[string]string{"a.yaml": good})
	set, _, err := Load(opts, dir)
	if err != nil {
		t.Fatalf("durable limits refused: %v", err)
	}
	want := map[string][]StoreKind{"d.day": {StoreDurable}, "d.month": {StoreDurable}, "d.hour": {StoreFast, StoreDurable}, "d.fast": {StoreFast}}
	for _, r := range set.Rules() {
		var got []StoreKind
		for _, l := range r.Limits {
			got = append(got, l.Store)
		}
		if w := want[r.Path]; len(got) != len(w) || !equalKinds(got, w) {
			t.Errorf("%s: stores %v, want %v", r.Path, got, w)
		}
	}
	var b strings.Builder
	if err := set.WriteExplain(&b); err != nil || !strings.Contains(b.String(), "fixed_window 5/day store=durable failure_mode=open") {
		t.Errorf("explain lacks store=durable (err %v):\n%s", err, b.String())
	}

	bad := head +
		"  - key: min\n    rate_limit:\n      unit: minute\n      unit_multiplier: 59\n      requests_per_unit: 5\n      store: durable\n" +
		"  - key: tb\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      algorithm: token_bucket\n      store: durable\n" +
		"  - key: fasttb\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: token_bucket}\n"
	dir = writeFiles(t, map[string]string{"a.yaml": bad})
	_, _, err = Load(opts, dir)
	if err == nil {
		t.Fatal("a durable 59-minute window and a durable token bucket loaded")
	}
	for _, w := range []string{
		`a.yaml:8: descriptor "d.min": store: durable needs a window of an hour or longer (window is 59m0s)`,
		`a.yaml:14: descriptor "d.tb": algorithm token_bucket is not supported by the durable store (supported: fixed_window, sliding_window)`,
		`a.yaml:16: descriptor "d.fasttb": algorithm token_bucket is not supported by the memcache backend`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\nlacks %q", err, w)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 3 {
		t.Errorf("%d errors, want 3:\n%s", n, err)
	}

	// Without a durable store, every durable limit is refused at its line,
	// in files and in xDS documents alike.
	_, _, err = LoadSources(LoadOptions{}, Source{Name: "xds:q", Data: []byte(good)})
	if err == nil {
		t.Fatal("durable limits loaded without a durable store")
	}
	for _, w := range []string{
		`xds:q:4: descriptor "d.day": store: durable needs a durable store, and none is configured (ratelimitd --durable-url)`,
		`xds:q:6: descriptor "d.month"`,
		`xds:q:10: descriptor "d.hour"`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\nlacks %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "d.fast") {
		t.Errorf("store: fast refused without a durable store: %v", err)
	}
}

func equalKinds(a, b []StoreKind) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The worked plan of docs/quotas.md (examples/quotas) loads with a
// durable store, its day and month limits on it and the burst guards on
// the fast store; without a durable store it is refused.
func TestQuotasExample(t *testing.T) {
	const dir = "../../examples/quotas"
	set, warns, err := Load(LoadOptions{Durable: DurableOptions{Enabled: true, Algorithms: []algo.Kind{algo.FixedWindow, algo.SlidingWindow}}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 0 { // the worked example must pass validate --strict
		t.Errorf("warnings: %v", warns)
	}
	durable := 0
	for _, r := range set.Rules() {
		for _, l := range r.Limits {
			if (l.Store == StoreDurable) != (l.Limit.Period >= MinDurableWindow) {
				t.Errorf("%s: %s window on store %d", r.Path, l.Limit.Period, l.Store)
			}
			if l.Store == StoreDurable {
				durable++
			}
		}
	}
	if durable != 4 {
		t.Errorf("%d durable limits, want 4", durable)
	}
	if _, _, err := Load(LoadOptions{}, dir); err == nil {
		t.Error("loaded without a durable store")
	}
}
