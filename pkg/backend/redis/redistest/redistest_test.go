package redistest_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStandaloneACLAndPassword(t *testing.T) {
	s := redistest.Standalone(t, redistest.WithPassword("secret"), redistest.WithACLUser("alice", "pw"))
	ctx := context.Background()
	opts, err := goredis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Username != "alice" || opts.Password != "pw" {
		t.Fatalf("URL %q does not carry the ACL user", s.URL())
	}
	c := goredis.NewClient(opts)
	defer c.Close()
	if err := c.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if who, err := c.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != "alice" {
		t.Fatalf("ACL WHOAMI = %q, %v", who, err)
	}
	bad := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "alice", Password: "wrong"})
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: err = %v", err)
	}
	if v, err := s.Client().Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("default user GET = %q, %v", v, err)
	}
}

func TestStandaloneTLS(t *testing.T) {
	s := redistest.Standalone(t, redistest.WithTLSClientAuth())
	if !strings.HasPrefix(s.URL(), "rediss://") {
		t.Fatalf("URL = %q", s.URL())
	}
	ctx := context.Background()
	if err := s.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("TLS ping: %v", err)
	}
	plain := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("plain-text PING to a TLS port succeeded")
	}
}

// TestProcessControls checks Stop, Cont, Kill and Restart through a
// client with short timeouts: a frozen server times its PING out, a
// killed one refuses it. A resumed or restarted server answers again,
// which the client sees once the process has been scheduled (on a loaded
// host later than its timeout): answers polls it, as a real client's
// retries would.
func TestProcessControls(t *testing.T) {
	s := redistest.Standalone(t)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	answers := func(what string) {
		t.Helper()
		deadline := time.Now().Add(redistest.StartTimeout)
		for {
			err := c.Ping(ctx).Err()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no answer within %v: %v", what, redistest.StartTimeout, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	s.Stop()
	err := c.Ping(ctx).Err()
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING to a frozen server: err = %v, want a timeout", err)
	}
	s.Cont()
	answers("after SIGCONT")

	s.Kill()
	if s.Alive() {
		t.Fatal("Alive after Kill")
	}
	if err := c.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("PING to a killed server: err = %v, want connection refused", err)
	}
	s.Restart()
	answers("after Restart")
}

func TestMaxMemoryAndReplica(t *testing.T) {
	m := redistest.Standalone(t, redistest.WithMaxMemory("1mb"))
	ctx := context.Background()
	c := m.Client()
	big := strings.Repeat("x", 64<<10)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		err = c.Set(ctx, "fill"+string(rune('a'+i%26))+strings.Repeat("y", i), big, 0).Err()
	}
	if err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("filling 1mb: err = %v, want OOM", err)
	}

	r := redistest.Standalone(t, redistest.WithReplicaOf(redistest.Standalone(t)))
	if err := r.Client().Set(ctx, "k", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on replica: err = %v, want READONLY", err)
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	c := g.Client()
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := c.Set(ctx, k, k, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	// Keys spread over all masters.
	for _, n := range g.Nodes {
		if size, err := n.Client().DBSize(ctx).Result(); err != nil || size == 0 {
			t.Errorf("node %s: dbsize %d, %v", n.Addr(), size, err)
		}
	}
}

func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("sentinel: -short")
	}
	g := redistest.Sentinel(t, redistest.WithPassword("pw"), redistest.WithSentinelPassword("spw"))
	c := goredis.NewFailoverClient(g.ClientOptions())
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := g.KillMaster()
	start := time.Now()
	nm := g.WaitFailover(old, redistest.FailoverWithin)
	t.Logf("failover to %s after %v", nm.Addr(), time.Since(start))
	if nm == old {
		t.Fatal("same master")
	}
	if g.Master() != nm {
		t.Fatal("Master() disagrees with WaitFailover")
	}
}

// TestSentinelFailoverAfterTilt: sentinels whose timers ran more than 2 s
// late (frozen here, as a starved host stalls them) enter TILT mode; a
// master killed during it is still failed over, within FailoverWithin:
// the TILT ends after TiltPeriod, while the replica is still a
// candidate. (With the default 30 s TILT the sentinels never promote it:
// its link to the master has been down too long by then.)
func TestSentinelFailoverAfterTilt(t *testing.T) {
	g := redistest.Sentinel(t)
	for _, s := range g.Sentinels {
		if err := syscall.Kill(s.Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond)
	for _, s := range g.Sentinels {
		if err := syscall.Kill(s.Pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := g.Sentinels[0].Do(ctx, "INFO", "sentinel")
		if err == nil && strings.Contains(info.(string), "sentinel_tilt:1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel not in TILT after a 2.5 s freeze: %v %v", info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	old := g.KillMaster()
	start := time.Now()
	nm := g.WaitFailover(old, redistest.FailoverWithin)
	t.Logf("failover to %s %v after the kill, the sentinels in TILT at it", nm.Addr(), time.Since(start))
}
