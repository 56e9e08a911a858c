package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// keysOn returns n keys whose slots the Cluster master at addr serves.
func keysOn(t *testing.T, g *redistest.ClusterGroup, addr string, n int) []string {
	t.Helper()
	c := g.Client()
	defer func() { _ = c.Close() }()
	slots, err := c.ClusterSlots(context.Background()).Result() //nolint:staticcheck // CLUSTER SHARDS needs Redis 7
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("node:%d", i)
		sl := int(redis.Slot(k))
		for _, r := range slots {
			if sl >= r.Start && sl <= r.End && len(r.Nodes) > 0 && r.Nodes[0].Addr == addr {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// TestOpenedLineNamesFrozenMaster: on a 3-master Cluster with one master
// frozen (SIGSTOP), the circuit-opened log line names that master
// (node: its address) and the cause (stalled or timeout), no line names
// another master, and the calls' errors name it too.
func TestOpenedLineNamesFrozenMaster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3, redistest.WithArgs("--cluster-require-full-coverage", "no"))
	logs := &testproc.Buffer{}
	ev := events.New(slog.New(slog.NewJSONHandler(logs, nil)), "redis")
	o := redis.DefaultOptions()
	o.Mode, o.URL, o.Addrs = redis.Cluster, "", g.Addrs()
	o.Breaker.OnTransition, o.Breaker.OnReport = ev.OnCircuit, ev.OnReport
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	victim := g.Nodes[1]
	keys := keysOn(t, g, victim.Addr(), 4)
	victim.Stop()
	defer victim.Cont()

	type line struct {
		Msg, Node, Cause, Error string
	}
	opened := func() []line {
		var out []line
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec line
			if l == "" || json.Unmarshal([]byte(l), &rec) != nil || !strings.HasPrefix(rec.Msg, "backend circuit opened") {
				continue
			}
			out = append(out, rec)
		}
		return out
	}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Hour}
	var lastErr error
	end := time.Now().Add(30 * time.Second)
	for len(opened()) == 0 {
		if time.Now().After(end) {
			t.Fatalf("no circuit-opened line 30 s after freezing %s; last error %v; log:\n%s", victim.Addr(), lastErr, logs.String())
		}
		for _, k := range keys {
			if _, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: k, Limit: l, Cost: 1}}); err != nil {
				lastErr = err
			}
		}
	}
	for _, rec := range opened() {
		t.Logf("%+v", rec)
		if rec.Node != victim.Addr() {
			t.Errorf("circuit-opened line names node %q, want the frozen master %s: %+v", rec.Node, victim.Addr(), rec)
		}
		if rec.Cause != redis.CauseStalled && rec.Cause != redis.CauseTimeout {
			t.Errorf("circuit-opened line: cause %q, want %q or %q: %+v", rec.Cause, redis.CauseStalled, redis.CauseTimeout, rec)
		}
	}
	if lastErr == nil || !strings.Contains(lastErr.Error(), victim.Addr()) {
		t.Errorf("a call on the frozen master failed with %v, want an error naming %s", lastErr, victim.Addr())
	}
}
