package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// TestNewStreamOnSpentBudget: ShouldRateLimit's hits spend the window of
// api=search (100 per second); a new stream's first answer for the bucket
// is DENY_ALL, not a full token bucket, because the assignment is a lease
// and the store has nothing left to lease. A bucket of another counter
// with budget left gets its token bucket, and what it was assigned is
// charged at once: ShouldRateLimit sees that much less.
func TestNewStreamOnSpentBudget(t *testing.T) {
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second
	// A frozen clock for the store's windows (the script's TIME): the
	// window does not end between the hits and the answer.
	o.Now = (&fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}).Now
	store, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	// The join's store calls get a budget a loaded host meets: the first
	// answer knows the spent budget when the store answers, which is what
	// this test is about.
	r := newRig(t, kindsConfig, store, func(o *Options) { o.Leases, o.joinTimeout, o.roundTimeout = store, 30*time.Second, 30*time.Second })
	set := loadSet(t, kindsConfig)
	take := func(entries []policy.Entry, cost int64) algo.Decision {
		t.Helper()
		m, ok := set.Match("edge", entries)
		if !ok {
			t.Fatalf("no rule for %v", entries)
		}
		d := make([]algo.Decision, 1)
		if err := store.Take(context.Background(), []algo.Hit{{Key: set.Key(m, 0), Limit: m.Rule.Limits[0].Limit, Cost: cost}}, d); err != nil {
			t.Fatal(err)
		}
		return d[0]
	}
	search := []policy.Entry{{Key: "api", Value: "search"}}
	if d := take(search, 100); !d.Allowed {
		t.Fatal("the window's 100 hits were denied")
	}
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), r.srv.TTL())); got != "DENY_ALL" {
		t.Errorf("first answer on a spent budget: %s, want DENY_ALL", got)
	}

	user := []policy.Entry{{Key: "tenant", Value: "t1"}, {Key: "user", Value: "u1"}}
	before := take(user, 0).Remaining
	c2 := r.open()
	uid := map[string]string{"tenant": "t1", "user": "u1"}
	c2.send("edge", usage(uid, 0, 1, 0))
	st := checkTTL(t, action(t, c2.recv(), uid), r.srv.TTL())
	tb := st.GetTokenBucket()
	if tb == nil {
		t.Fatalf("first answer with budget left: %s, want a token bucket", blanketOf(st))
	}
	reserved := before - take(user, 0).Remaining
	perInterval := int64(tb.GetMaxTokens()) + int64(tb.GetTokensPerFill().GetValue())/int64(tb.GetFillInterval().AsDuration().Seconds())
	if reserved < perInterval {
		t.Errorf("the assignment (%d tokens + %d per interval) reserved %d of the window", tb.GetMaxTokens(), perInterval-int64(tb.GetMaxTokens()), reserved)
	}
}
