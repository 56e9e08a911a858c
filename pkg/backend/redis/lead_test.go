package redis

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// TestLeadHints: a denied hit makes its key hot until max(RetryAfter,
// leadHintMin), and only that key: another key sharing its table entry
// is not; a hot group leads, then the group whose tightest hit fits the
// fewest times in its capacity; soft hits and releases do not count.
func TestLeadHints(t *testing.T) {
	h := newLeadHints()
	now := time.Now()
	small := algo.Limit{Kind: algo.FixedWindow, Rate: 4, Period: time.Hour}
	big := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	tb := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Burst: 2, Period: time.Hour}

	if h.hot("a", now) {
		t.Fatal("a key never denied is hot")
	}
	h.note([]algo.Hit{{Key: "a"}, {Key: "b"}, {Key: "s", Soft: true}},
		[]algo.Decision{{Allowed: false, RetryAfter: 5 * time.Second}, {Allowed: true}, {Allowed: false}}, now)
	for _, c := range []struct {
		key  string
		at   time.Duration
		want bool
	}{
		{"a", 0, true}, {"a", 4900 * time.Millisecond, true}, {"a", 5100 * time.Millisecond, false},
		{"b", 0, false}, // allowed
		{"s", 0, false}, // soft: never denies a request
	} {
		if got := h.hot(c.key, now.Add(c.at)); got != c.want {
			t.Errorf("hot(%q) at +%v = %v, want %v", c.key, c.at, got, c.want)
		}
	}
	h.note([]algo.Hit{{Key: "c"}}, []algo.Decision{{Allowed: false, RetryAfter: time.Millisecond}}, now)
	if !h.hot("c", now.Add(leadHintMin-10*time.Millisecond)) || h.hot("c", now.Add(leadHintMin+10*time.Millisecond)) {
		t.Errorf("a denial with a short RetryAfter is not hot for leadHintMin (%v)", leadHintMin)
	}

	// a key on a's entry with another fingerprint is not hot
	ea, fa := h.entry("a")
	other := ""
	for i := 0; other == ""; i++ {
		k := fmt.Sprint("k", i)
		if e, f := h.entry(k); e == ea && f != fa {
			other = k
		}
	}
	if h.hot(other, now) {
		t.Errorf("%q shares a's entry and reads as hot", other)
	}

	score := func(hits ...algo.Hit) int64 { return h.leadScore(hits, now) }
	if score(algo.Hit{Key: "a", Limit: big, Cost: 1}) >= score(algo.Hit{Key: "x", Limit: small, Cost: 1}) {
		t.Error("a hot key's group does not lead a smaller limit's")
	}
	if score(algo.Hit{Key: "x", Limit: small, Cost: 1}) >= score(algo.Hit{Key: "y", Limit: big, Cost: 1}) {
		t.Error("the smaller limit does not lead")
	}
	if score(algo.Hit{Key: "y", Limit: big, Cost: 500}) >= score(algo.Hit{Key: "x", Limit: small, Cost: 1}) {
		t.Error("capacity / cost: 1000/500 does not lead 4/1")
	}
	if score(algo.Hit{Key: "t", Limit: tb, Cost: 1}) >= score(algo.Hit{Key: "x", Limit: small, Cost: 1}) {
		t.Error("a token bucket's capacity is not its burst")
	}
	if got := score(algo.Hit{Key: "x", Limit: small, Cost: 1, Soft: true}, algo.Hit{Key: "y", Limit: small, Cost: 1, Release: true}); got != math.MaxInt64 {
		t.Errorf("a group of a soft hit and a release scores %d, want last (MaxInt64)", got)
	}
	if score(algo.Hit{Key: "z", Limit: algo.Limit{Kind: algo.FixedWindow, Period: time.Hour}, Cost: 1}) != 0 {
		t.Error("a rate-0 limit (denies everything) does not score 0")
	}
}
