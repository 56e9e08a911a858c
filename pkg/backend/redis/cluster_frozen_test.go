package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// clusterOptions are DefaultOptions for the Cluster g.
func clusterOptions(g *redistest.ClusterGroup) redis.Options {
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	return o
}

// commandStats is the calls of each command name (cmdstat_<name>) the
// node served since its last CONFIG RESETSTAT.
func commandStats(t *testing.T, n *redistest.Server) map[string]int64 {
	t.Helper()
	v, err := n.Do(context.Background(), "INFO", "commandstats")
	if err != nil {
		t.Fatalf("%s: INFO commandstats: %v", n.Addr(), err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(fmt.Sprint(v), "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(rest, "calls=") {
			continue
		}
		var calls int64
		if _, err := fmt.Sscanf(rest, "calls=%d", &calls); err == nil {
			out[name] = calls
		}
	}
	return out
}

// TestClusterClientSendsNoCommand: a Cluster Store routes its calls by
// hash slot alone. It never sends COMMAND, whose reply go-redis' routing
// policies fetch from a random node under a lock every call of the client
// shares, so that a frozen node would hold every master's decisions.
func TestClusterClientSendsNoCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	keysOf := masterKeys(t, g) // before RESETSTAT: the test's own client may send COMMAND
	ctx := context.Background()
	for _, n := range g.Nodes {
		if _, err := n.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
			t.Fatalf("%s: CONFIG RESETSTAT: %v", n.Addr(), err)
		}
	}
	o := clusterOptions(g)
	o.Timeout = time.Second // Reset's budget per key: healthy nodes on a loaded host
	s := openStore(t, o)
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	const limit, callers = 5, 12
	l := algo.Limit{Kind: algo.SlidingLog, Rate: limit, Period: time.Hour}
	var all []string
	for _, n := range g.Nodes {
		keys := keysOf[n.Addr()]("nocommand", 2)
		all = append(all, keys...)
		// Lone decisions (one invocation per flush) and concurrent ones.
		for k, c := range burst(s, keys, l, callers, 0) {
			if c.allowed != limit || c.denied != callers-limit || len(c.causes) > 0 {
				t.Errorf("key %s: allowed %d, denied %d, errors %v; want %d, %d, none", k, c.allowed, c.denied, c.causes, limit, callers-limit)
			}
		}
	}
	// A request over every master's slots, a lease and a reset.
	hits := make([]algo.Hit, len(all))
	for i, k := range all {
		hits[i] = algo.Hit{Key: k + ":multi", Limit: l, Cost: 1}
	}
	if _, err := algotest.Take(ctx, s, hits); err != nil {
		t.Errorf("Take over every master: %v", err)
	}
	lease := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Burst: 100, Period: time.Second}
	if g, err := s.Lease(ctx, algo.LeaseRequest{Key: all[0] + ":lease", Limit: lease, Subscriber: 1, Want: 10, Stale: 1e6}); err != nil || g.Granted != 10 {
		t.Errorf("Lease: %+v, %v; want 10 granted", g, err)
	}
	if err := s.Reset(ctx, hits); err != nil {
		t.Errorf("Reset: %v", err)
	}
	var scripts int64
	for _, n := range g.Nodes {
		st := commandStats(t, n)
		for name, calls := range st {
			if name == "command" || strings.HasPrefix(name, "command|") {
				t.Errorf("%s served %s %d times", n.Addr(), name, calls)
			}
		}
		scripts += st["evalsha"] + st["eval"] + st["fcall"]
	}
	if scripts == 0 {
		t.Fatalf("no script call reached the cluster")
	}
}

// TestClusterFrozenMasterColdClients: right after one of three masters
// freezes (SIGSTOP), Stores whose clients have looked nothing up since
// Warm decide the live masters' keys, and grant their leases, within the
// callers' deadline: a burst over the limit admits exactly the limit with
// no error. Many Stores, each with a client of its own, at once, so that
// none passes by its client having asked a live node first (the health
// probe, which would look things up, does not run meanwhile).
func TestClusterFrozenMasterColdClients(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	const (
		stores   = 12
		limit    = 5
		callers  = 12
		deadline = 1500 * time.Millisecond // the callers'; well under MaxWait
	)
	g := redistest.Cluster(t, 3, redistest.WithArgs("--cluster-require-full-coverage", "no"))
	frozen := g.Nodes[1]
	keysOf := masterKeys(t, g)
	o := clusterOptions(g)
	// A frozen node's reply is awaited for MaxWait: longer than the
	// callers' deadline, so that waiting on one fails them.
	o.MaxWait = 3 * time.Second
	// No health probe before the freeze: its calls would look things up.
	o.HealthInterval = time.Minute
	ss := make([]*redis.Store, stores)
	for i := range ss {
		ss[i] = openStore(t, o)
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := ss[i].Warm(wctx)
		cancel()
		if err != nil {
			t.Fatalf("store %d: Warm: %v", i, err)
		}
	}
	frozen.Stop()
	defer frozen.Cont()
	l := algo.Limit{Kind: algo.SlidingLog, Rate: limit, Period: time.Hour}
	lease := algo.Limit{Kind: algo.TokenBucket, Rate: 1000, Burst: 100, Period: time.Second}
	type result struct {
		key    string
		tally  *burstTally
		grant  algo.LeaseGrant
		leased error
	}
	results := make([]result, stores)
	var wg sync.WaitGroup
	for i, s := range ss {
		live := g.Nodes[2*(i%2)] // Nodes[0] or Nodes[2]
		keys := keysOf[live.Addr()](fmt.Sprintf("cold-%d", i), 2)
		key := keys[0]
		results[i].key = key
		wg.Go(func() { results[i].tally = burst(s, []string{key}, l, callers, deadline)[key] })
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			results[i].grant, results[i].leased = s.Lease(ctx, algo.LeaseRequest{Key: keys[1], Limit: lease, Subscriber: 1, Want: 10, Stale: 1e6})
		})
	}
	wg.Wait()
	for i, r := range results {
		if c := r.tally; c.allowed != limit || c.denied != callers-limit || len(c.causes) > 0 {
			t.Errorf("store %d, key %s on a live master: allowed %d, denied %d, errors %v; want %d, %d, none",
				i, r.key, c.allowed, c.denied, c.causes, limit, callers-limit)
		}
		if r.leased != nil || r.grant.Granted != 10 {
			t.Errorf("store %d, lease on a live master: %+v, %v; want 10 granted", i, r.grant, r.leased)
		}
	}
}
