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
// fewest times in its capacity; soft hits and releases do not count; a
// group with a hit that can never be admitted leads even a hot group.
// The clock is pinned far from the wall clock, as a test's Options.Now
// may be: the hints read the Store's clock only.
func TestLeadHints(t *testing.T) {
	for _, now := range []time.Time{
		time.Date(1901, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC),
		time.Date(2199, 12, 31, 23, 59, 59, 0, time.UTC),
	} {
		t.Run(now.Format("2006"), func(t *testing.T) { testLeadHints(t, now) })
	}
}

func testLeadHints(t *testing.T, now time.Time) {
	h := newLeadHints(now)
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
	// never admitted: a rate of 0, or a cost above the capacity
	zero := algo.Hit{Key: "z", Limit: algo.Limit{Kind: algo.SlidingWindow, Period: time.Hour}, Cost: 1}
	over := algo.Hit{Key: "o", Limit: tb, Cost: 3}
	hot := algo.Hit{Key: "a", Limit: small, Cost: 1}
	for _, never := range []algo.Hit{zero, over} {
		if score(never) >= score(hot) {
			t.Errorf("a group of %+v, never admitted, does not lead a hot key's group", never)
		}
		if got := score(hot, never); got != score(never) {
			t.Errorf("a hot hit and %+v score %d, want that of the never-admitted hit", never, got)
		}
	}
	if score(algo.Hit{Key: "z", Limit: zero.Limit, Cost: 1, Soft: true}) != math.MaxInt64 {
		t.Error("a soft hit on a rate-0 limit counts")
	}
}
