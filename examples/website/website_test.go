// Package website_test replays the real access log shipped in testdata/
// (10,000 requests to a public blog, see testdata/README.md) through
// envoy/website.yaml and config.yaml with the memory and the Redis store.
package website_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const logFile = "testdata/semicomplete-2015.log"

func run(t *testing.T, newStore func(clock *replay.Clock) service.Store) (*replay.Report, []byte) {
	t.Helper()
	set, _, err := policy.Load(policy.LoadOptions{}, ".")
	if err != nil {
		t.Fatal(err)
	}
	env, err := replay.LoadEnvoy("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	clock := &replay.Clock{}
	rep, err := replay.Run(context.Background(), f, replay.Options{
		Envoy: env, Policy: set, Store: newStore(clock), Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	return rep, js.Bytes()
}

func memoryStore(t *testing.T) func(*replay.Clock) service.Store {
	return func(clock *replay.Clock) service.Store {
		st, err := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
}

// check verifies the report of the whole log: every line replayed, counts
// that add up, every descriptor answered by a rule, and the calibration
// claim of config.yaml: only clients without a User-Agent (vulnerability
// scanners in this log) are denied, and less than 1% of traffic.
func check(t *testing.T, rep *replay.Report) {
	t.Helper()
	if rep.Lines != 10000 || rep.Requests != 10000 || rep.Malformed != 0 {
		t.Fatalf("lines %d requests %d malformed %d, want 10000/10000/0", rep.Lines, rep.Requests, rep.Malformed)
	}
	if got := rep.Allowed + rep.Denied + rep.ShadowDenied + rep.NotChecked; got != rep.Requests {
		t.Errorf("allowed+denied+shadow+not checked = %d, want %d", got, rep.Requests)
	}
	if rep.NotChecked != 0 || rep.Unmatched != 0 {
		t.Errorf("not checked %d, unmatched descriptors %d (%v): every request must be checked by a rule", rep.NotChecked, rep.Unmatched, rep.UnmatchedShapes)
	}
	sum, denials := rep.Unmatched, 0
	for _, r := range rep.Rules {
		sum += r.Allowed + r.Denied + r.Shadow
		denials += r.Denied
		if r.Denied > 0 && r.Name != "no-user-agent-per-ip" {
			t.Errorf("rule %s denied %d requests of real users", r.Path, r.Denied)
		}
	}
	if sum != rep.Descriptors {
		t.Errorf("per-rule counts add up to %d, want %d descriptors", sum, rep.Descriptors)
	}
	if rep.Denied == 0 || denials < rep.Denied {
		t.Errorf("denied %d requests, rule denials %d: want some, each with a denying rule", rep.Denied, denials)
	}
	if rep.DeniedShare >= 0.01 {
		t.Errorf("denied share %.4f, want < 1%%", rep.DeniedShare)
	}
	if len(rep.Minutes) == 0 || rep.First.Year() != 2015 {
		t.Errorf("minutes %d, first %v", len(rep.Minutes), rep.First)
	}
}

// TestReplayMemoryDeterministic: the example's replay on the memory store
// meets the example's claims, and two replays of the log give the same
// report byte for byte.
func TestReplayMemoryDeterministic(t *testing.T) {
	rep, a := run(t, memoryStore(t))
	check(t, rep)
	_, b := run(t, memoryStore(t))
	if !bytes.Equal(a, b) {
		t.Error("two replays of the same log differ")
	}
	t.Logf("denied %d (%.2f%%) of %d requests", rep.Denied, 100*rep.DeniedShare, rep.Requests)
}

// TestReplayRedisMatchesMemory: the replay on Redis gives the same report
// as on the memory store.
func TestReplayRedisMatchesMemory(t *testing.T) {
	srv := redistest.Standalone(t)
	_, want := run(t, memoryStore(t))
	rep, got := run(t, func(clock *replay.Clock) service.Store {
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.Timeout = 5 * time.Second // a decision must not fail open, however slow the scheduling
		o.Now = clock.Now
		st, err := redis.New(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
	check(t, rep)
	if !bytes.Equal(want, got) {
		t.Errorf("redis and memory replays differ:\nmemory: %.2000s\nredis:  %.2000s", want, got)
	}
}
