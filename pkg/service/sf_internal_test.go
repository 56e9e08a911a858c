package service

import (
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// sfReference serializes the RateLimit-Policy and RateLimit items of one
// limit with httpsfv, the way the service did before it serialized them
// directly: the direct serialization must give the same bytes and fail
// (omit the header) in the same cases.
func sfReference(name string, concurrency bool, rate, win, remaining, reset int64) (pol string, polErr error, lim string, limErr error) {
	pi := httpsfv.NewItem(name)
	pi.Params.Add("q", rate)
	if concurrency {
		pi.Params.Add("qu", "concurrent-requests")
	} else {
		pi.Params.Add("w", win)
	}
	pol, polErr = httpsfv.Marshal(httpsfv.List{pi})
	li := httpsfv.NewItem(name)
	li.Params.Add("r", remaining)
	li.Params.Add("t", reset)
	lim, limErr = httpsfv.Marshal(httpsfv.List{li})
	return
}

func checkSF(t *testing.T, policyName string, concurrency bool, rate int64, window time.Duration, remaining, reset int64) {
	t.Helper()
	kind := algo.FixedWindow
	if concurrency {
		kind = algo.Concurrency
	}
	r := &policy.Rule{Path: "d.k"}
	sp := &policy.Spec{Policy: policyName, Window: window, Limit: algo.Limit{Kind: kind, Rate: rate, Period: time.Second}}
	in := newSpecInfo(r, sp)
	if want := specPolicyName(r, sp); in.name != want {
		t.Fatalf("name %q, want %q", in.name, want)
	}
	pol, polErr, lim, limErr := sfReference(in.name, concurrency, rate, atLeast1(ceilSeconds(window)), remaining, reset)
	if in.policyOK != (polErr == nil) {
		t.Fatalf("policy item %q ok=%v, httpsfv: %q, %v", in.policyItem, in.policyOK, pol, polErr)
	}
	if in.policyOK && in.policyItem != pol {
		t.Fatalf("policy item %q, httpsfv %q", in.policyItem, pol)
	}
	b := []byte(in.quoted)
	b, ok1 := appendSFIntParam(b, "r", remaining)
	b, ok2 := appendSFIntParam(b, "t", reset)
	if (ok1 && ok2) != (limErr == nil) {
		t.Fatalf("limit item %q ok=%v, httpsfv: %q, %v", b, ok1 && ok2, lim, limErr)
	}
	if limErr == nil && string(b) != lim {
		t.Fatalf("limit item %q, httpsfv %q", b, lim)
	}
}

func TestSFSerializationMatchesHTTPSFV(t *testing.T) {
	for _, c := range []struct {
		name             string
		concurrency      bool
		rate             int64
		window           time.Duration
		remaining, reset int64
	}{
		{"per-user", false, 1000, time.Second, 999, 1},
		{`quote"and\backslash`, false, 5, time.Hour, 0, 3600},
		{"ünïcode\x00\x7f", true, 3, 0, 2, 1},
		{"", false, 1, 1500 * time.Millisecond, 0, 2},
		{"big", false, 999_999_999_999_999, time.Second, 999_999_999_999_999, 1},
		{"too-big-rate", false, 1_000_000_000_000_000, time.Second, 1, 1},
		{"too-big-remaining", false, 10, time.Second, 1_000_000_000_000_000, 1},
		{"negative", false, -1_000_000_000_000_000, time.Second, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) { checkSF(t, c.name, c.concurrency, c.rate, c.window, c.remaining, c.reset) })
	}
}

func FuzzSFSerialization(f *testing.F) {
	f.Add("per-user", false, int64(1000), int64(time.Second), int64(999), int64(1))
	f.Add(`a"b\c`, true, int64(1_000_000_000_000_000), int64(0), int64(-5), int64(1))
	f.Fuzz(func(t *testing.T, name string, concurrency bool, rate, window, remaining, reset int64) {
		checkSF(t, name, concurrency, rate, time.Duration(window), remaining, reset)
	})
}
