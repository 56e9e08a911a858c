package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// incrScript counts its runs in its key.
const incrScript = "return redis.call('INCR', KEYS[1])"

// TestClusterClientSendsOnce: a Cluster client built by NewClient sends a
// script call that timed out on a frozen master once. go-redis' Cluster
// layer would re-send it (and a pipeline of them) on a new connection,
// and the master, once it runs again, would run every copy. The callers'
// deadline is well past MaxWait, so a retry would have the time to send.
func TestClusterClientSendsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	frozen := g.Nodes[1]
	keys := masterKeys(t, g)[frozen.Addr()]("sendonce", 3)
	ctx := context.Background()
	// clients is how many connections the frozen master lists.
	check := goredis.NewClient(frozen.ClientOptions())
	defer func() { _ = check.Close() }()
	clients := func() (int, error) {
		list, err := check.ClientList(ctx).Result()
		return strings.Count(strings.TrimSpace(list), "\n") + 1, err
	}
	others, err := clients() // the test's own: the check, masterKeys'
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	o := clusterOptions(g)
	o.MaxWait = 300 * time.Millisecond
	c, err := redis.NewClient(o)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Load the slot map and the script; check the counters start at 0.
	if err := c.ScriptLoad(ctx, incrScript).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	sha := goredis.NewScript(incrScript).Hash()
	// Dial PoolSize connections to the frozen master and leave them idle
	// in the pool, as the Store's warm-up does: a retry would find one
	// ready to send on, with no handshake to wait for.
	nc, err := c.(*goredis.ClusterClient).MasterForKey(ctx, keys[0])
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	conns := make([]*goredis.Conn, o.PoolSize)
	for i := range conns {
		conns[i] = nc.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			t.Fatalf("PING: %v", err)
		}
	}
	for _, cn := range conns {
		_ = cn.Close() // back to the pool
	}

	frozen.Stop()
	stopped := true
	defer func() {
		if stopped {
			frozen.Cont()
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// A lone call (Process) and a pipeline of calls on two keys.
	if err := c.EvalSha(cctx, sha, keys[:1]).Err(); err == nil {
		t.Errorf("EVALSHA on a frozen master: no error")
	}
	cmds, _ := c.Pipelined(cctx, func(p goredis.Pipeliner) error {
		p.EvalSha(cctx, sha, keys[1:2])
		p.EvalSha(cctx, sha, keys[2:3])
		return nil
	})
	for _, cmd := range cmds {
		if cmd.Err() == nil {
			t.Errorf("pipelined EVALSHA on a frozen master: no error")
		}
	}
	frozen.Cont()
	stopped = false

	// Once the master runs again it runs the commands its sockets hold,
	// then drops the connections the client closed: wait until it lists
	// only the test's own, then read the counts.
	_ = c.Close()
	want := map[string]int{keys[0]: 1, keys[1]: 1, keys[2]: 1}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := clients()
		if err == nil && n <= others {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("frozen master still lists %d connections, want %d (%v)", n, others, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := map[string]int{}
	for _, k := range keys {
		v, err := check.Get(ctx, k).Result()
		if err != nil && err != goredis.Nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		n, _ := strconv.Atoi(v)
		got[k] = n
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("key %s: the script ran %d times, want %d (one send)", k, got[k], w)
		}
	}
}

// TestClusterStorePoolWarm: after Warm, a Cluster Store's bursts of
// decisions over many slots of every master (pipelines) dial nothing:
// pipelines use the connections Warm dialed, and each node has at most
// PoolSize connections from the Store.
func TestClusterStorePoolWarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	keysOf := masterKeys(t, g)
	o := clusterOptions(g)
	o.HealthInterval = time.Minute // no probe during the burst
	o.PoolSize = 4
	s := openStore(t, o)
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	// received is each node's count of accepted connections.
	received := func() map[string]int {
		out := map[string]int{}
		for _, n := range g.Nodes {
			v, err := n.Do(ctx, "INFO", "stats")
			if err != nil {
				t.Fatalf("%s: INFO stats: %v", n.Addr(), err)
			}
			f, ok := "", false
			for line := range strings.SplitSeq(fmt.Sprint(v), "\n") {
				if f, ok = strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
					break
				}
			}
			c, err := strconv.Atoi(f)
			if !ok || err != nil {
				t.Fatalf("%s: INFO stats has no total_connections_received:\n%v", n.Addr(), v)
			}
			out[n.Addr()] = c
		}
		return out
	}
	before := received()
	const callers, slotsPerMaster, rounds = 16, 6, 20
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
	var hits []algo.Hit
	for _, n := range g.Nodes {
		for _, k := range keysOf[n.Addr()]("warmpool", slotsPerMaster) {
			hits = append(hits, algo.Hit{Key: k, Limit: l, Cost: 1})
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range callers {
		wg.Go(func() {
			for range rounds {
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := algotest.Take(tctx, s, hits)
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d Takes failed, first: %v", len(errs), errs[0])
	}
	after := received()
	for _, n := range g.Nodes {
		a := n.Addr()
		// received counts the test's own INFO connection once per read.
		if d := after[a] - before[a] - 1; d != 0 {
			t.Errorf("%s: %d connections dialed during the burst after Warm, want 0", a, d)
		}
		v, err := n.Do(ctx, "CLIENT", "LIST")
		if err != nil {
			t.Fatalf("%s: CLIENT LIST: %v", a, err)
		}
		// The lines but the test's own CLIENT LIST connection's.
		if conns := strings.Count(strings.TrimSpace(fmt.Sprint(v)), "\n"); conns > o.PoolSize {
			t.Errorf("%s: %d connections from the Store, want <= PoolSize %d", a, conns, o.PoolSize)
		}
	}
}

// TestClusterClientFollowsRedirects: a Cluster client built by NewClient,
// which re-sends nothing else, still follows ASK (a slot being migrated)
// and MOVED (a slot moved since the client loaded the slot map), alone
// and in a pipeline: the node answers them without running the call.
func TestClusterClientFollowsRedirects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	src, dst := g.Nodes[0], g.Nodes[1]
	key := masterKeys(t, g)[src.Addr()]("redirect", 1)[0]
	slot := int(redis.Slot(key))
	ctx := context.Background()
	do := func(n *redistest.Server, args ...any) any {
		t.Helper()
		v, err := n.Do(ctx, args...)
		if err != nil {
			t.Fatalf("%s: %v: %v", n.Addr(), args, err)
		}
		return v
	}
	id := func(n *redistest.Server) string { return fmt.Sprint(do(n, "CLUSTER", "MYID")) }
	c, err := redis.NewClient(clusterOptions(g))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.ScriptLoad(ctx, incrScript).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	sha := goredis.NewScript(incrScript).Hash()
	run := func(k string, want int64) {
		t.Helper()
		if v, err := c.EvalSha(ctx, sha, []string{k}).Int64(); err != nil || v != want {
			t.Errorf("EVALSHA %s: %d, %v; want %d", k, v, err, want)
		}
		cmds, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.EvalSha(ctx, sha, []string{k})
			return nil
		})
		if err != nil {
			t.Errorf("pipelined EVALSHA %s: %v", k, err)
			return
		}
		if v, err := cmds[0].(*goredis.Cmd).Int64(); err != nil || v != want+1 {
			t.Errorf("pipelined EVALSHA %s: %d, %v; want %d", k, v, err, want+1)
		}
	}
	run(key, 1) // loads the slot map

	// ASK: the slot migrates from src to dst; a key src lacks is asked of dst.
	do(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", id(src))
	do(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", id(dst))
	run("{"+key+"}:ask", 1)

	// MOVED: the slot and its keys now belong to dst; the client's map
	// still names src.
	do(src, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", key)
	for _, n := range g.Nodes {
		do(n, "CLUSTER", "SETSLOT", slot, "NODE", id(dst))
	}
	run(key, 3)

	// The redirects happened: src answered ASK, then MOVED, to both sends.
	info := fmt.Sprint(do(src, "INFO", "errorstats"))
	for _, e := range []string{"ASK", "MOVED"} {
		if n := infoField(t, info, "errorstat_"+e, "count"); n < 2 {
			t.Errorf("%s answered %s %d times, want >= 2", src.Addr(), e, n)
		}
	}
}
