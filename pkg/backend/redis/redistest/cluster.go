package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ClusterGroup is a Redis Cluster of masters without replicas, created with
// `redis-cli --cluster create`.
type ClusterGroup struct {
	t testing.TB
	// Nodes are the masters, in creation order (slots split evenly in that
	// order by redis-cli).
	Nodes []*Server
}

// Cluster starts masters (>= 3) cluster-enabled redis-servers, joins them
// with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`
// and waits until every node reports cluster_state:ok and agrees on the
// slot map. opts apply to every node (WithPassword is supported; TLS is not).
func Cluster(t testing.TB, masters int, opts ...Option) *ClusterGroup {
	t.Helper()
	Require(t)
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.tls {
		t.Fatalf("redistest: TLS clusters are not supported")
	}
	cfg.cluster = true
	g := &ClusterGroup{t: t}
	for i := 0; i < masters; i++ {
		s := newServer(t, cfg)
		s.startFresh()
		g.Nodes = append(g.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	args = append(args, g.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if cfg.password != "" {
		args = append(args, "-a", cfg.password, "--no-auth-warning")
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	g.WaitOK()
	return g
}

// Addrs are the nodes' "127.0.0.1:port" addresses (seed nodes for a client).
func (g *ClusterGroup) Addrs() []string { return addrsOf(g.Nodes) }

// addrsOf returns the "127.0.0.1:port" addresses of servers, in order.
func addrsOf(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// ClientOptions are go-redis cluster options for test setup and assertions.
func (g *ClusterGroup) ClientOptions() *goredis.ClusterOptions {
	n := g.Nodes[0]
	return &goredis.ClusterOptions{
		Addrs:        g.Addrs(),
		Password:     n.cfg.password,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		PoolSize:     4,
	}
}

// Client returns a go-redis cluster client for test setup and assertions;
// it is closed when the test ends.
func (g *ClusterGroup) Client() *goredis.ClusterClient {
	c := goredis.NewClusterClient(g.ClientOptions())
	g.t.Cleanup(func() { _ = c.Close() })
	return c
}

// WaitOK waits until every live node reports cluster_state:ok, all 16384
// slots assigned, and the same slot map (CLUSTER SLOTS) as the others.
func (g *ClusterGroup) WaitOK() {
	g.t.Helper()
	deadline := time.Now().Add(StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if last = g.check(); last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.t.Fatalf("redistest: cluster not ok after %v: %v", StartTimeout, last)
}

func (g *ClusterGroup) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var ref string
	for _, n := range g.Nodes {
		if !n.Alive() {
			continue
		}
		info, err := n.Do(ctx, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		s := fmt.Sprint(info)
		if !strings.Contains(s, "cluster_state:ok") || !strings.Contains(s, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", n.Addr(), firstLines(s, 3))
		}
		slots, err := n.Do(ctx, "CLUSTER", "SLOTS")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		m := slotMap(slots)
		if ref == "" {
			ref = m
		} else if m != ref {
			return fmt.Errorf("%s: slot map differs", n.Addr())
		}
	}
	return nil
}

// slotMap renders CLUSTER SLOTS as "start-end:port ..." sorted by start.
func slotMap(v any) string {
	rows, _ := v.([]any)
	parts := make([]string, 0, len(rows))
	for _, r := range rows {
		cols, _ := r.([]any)
		if len(cols) < 3 {
			continue
		}
		master, _ := cols[2].([]any)
		if len(master) < 2 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%v-%v:%v", cols[0], cols[1], master[1]))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}
