package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// MasterName is the name the sentinels started by Sentinel monitor.
const MasterName = "mymaster"

// Sentinel timing: a master is subjectively down after DownAfter without
// answers; a failover attempt is retried after FailoverTimeout.
const (
	DownAfter       = 500 * time.Millisecond
	FailoverTimeout = 2 * time.Second
)

// TiltPeriod is how long a sentinel stays in TILT mode, in which it acts
// on nothing: it enters it when its timer runs more than 2 s late, as on a
// starved host. redis-server's default, 30 s, would make a TILT that spans
// the master's death stop the failover for good: a sentinel skips a
// replica whose link to the master has been down for more than
// 10 × DownAfter beyond the master's SDOWN, and the SDOWN comes only
// after the TILT. So the sentinels here leave TILT after 4 × DownAfter,
// set once each answers (SENTINEL DEBUG tilt-period).
const TiltPeriod = 4 * DownAfter

// FailoverWithin bounds the wait for a failover (WaitFailover's timeout
// in tests), polled: DownAfter, the leader election, attempts retried
// every 2 × FailoverTimeout and the replica's promotion take a few
// seconds, and on a starved host each stall of a sentinel adds a
// TiltPeriod.
const FailoverWithin = time.Minute

// WithSentinels sets the number of sentinels started by Sentinel (default
// 3; quorum is a majority). Ignored by Standalone and Cluster.
func WithSentinels(n int) Option { return func(c *config) { c.sentinels = n } }

// WithSentinelPassword sets requirepass on the sentinels themselves (go-redis
// FailoverOptions.SentinelPassword). Ignored by Standalone and Cluster.
func WithSentinelPassword(pw string) Option {
	return func(c *config) { c.sentinelPassword = pw }
}

// SentinelGroup is a master, one replica and sentinels monitoring MasterName.
type SentinelGroup struct {
	t testing.TB
	// Data are the master (Data[0] initially) and the replica (Data[1]).
	Data []*Server
	// Sentinels are the sentinel processes.
	Sentinels []*Server
}

// Sentinel starts a master, a replica of it and (by default 3) sentinels
// with quorum = majority, DownAfter and FailoverTimeout, and waits until the
// replica is in sync and the sentinels know each other and the replica
// (SENTINEL CKQUORUM ok). opts other than WithSentinels and
// WithSentinelPassword apply to the master and the replica (WithPassword is
// passed to the sentinels as auth-pass; TLS is not supported).
func Sentinel(t testing.TB, opts ...Option) *SentinelGroup {
	t.Helper()
	Require(t)
	cfg := config{sentinels: 3}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.tls {
		t.Fatalf("redistest: TLS sentinel deployments are not supported")
	}
	if cfg.sentinels < 1 {
		t.Fatalf("redistest: need at least one sentinel, got %d", cfg.sentinels)
	}
	g := &SentinelGroup{t: t}
	data := cfg
	data.sentinels, data.sentinelPassword = 0, ""
	master := newServer(t, data)
	master.startFresh()
	rcfg := data
	rcfg.replicaOf = master
	replica := newServer(t, rcfg)
	replica.startFresh()
	g.Data = []*Server{master, replica}

	quorum := cfg.sentinels/2 + 1
	for i := 0; i < cfg.sentinels; i++ {
		scfg := config{
			password: cfg.sentinelPassword,
			sentinel: &sentinelConfig{master: master, quorum: quorum, authPass: cfg.password, authUser: cfg.user, authUserPW: cfg.userPW},
		}
		s := newServer(t, scfg)
		s.startFresh()
		g.Sentinels = append(g.Sentinels, s)
	}
	g.waitConverged()
	return g
}

type sentinelConfig struct {
	master                         *Server
	quorum                         int
	authPass, authUser, authUserPW string
}

// sentinelArgs writes sentinel.conf (sentinels rewrite it, so it is only
// written for a fresh start) and returns the redis-server arguments.
func (s *Server) sentinelArgs() []string {
	sc := s.cfg.sentinel
	conf := filepath.Join(s.dir, "sentinel.conf")
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\n",
		s.port, s.dir, filepath.Join(s.dir, "redis.log"))
	if s.cfg.password != "" {
		fmt.Fprintf(&b, "requirepass %s\n", s.cfg.password)
	}
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", MasterName, sc.master.port, sc.quorum)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", MasterName, DownAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", MasterName, FailoverTimeout.Milliseconds())
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", MasterName)
	switch {
	case sc.authUser != "":
		fmt.Fprintf(&b, "sentinel auth-user %s %s\nsentinel auth-pass %s %s\n", MasterName, sc.authUser, MasterName, sc.authUserPW)
	case sc.authPass != "":
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", MasterName, sc.authPass)
	}
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
	return []string{conf, "--sentinel"}
}

// SentinelAddrs are the sentinels' "127.0.0.1:port" addresses.
func (g *SentinelGroup) SentinelAddrs() []string { return addrsOf(g.Sentinels) }

// ClientOptions are go-redis failover options for test setup and
// assertions (default user password, sentinel password).
func (g *SentinelGroup) ClientOptions() *goredis.FailoverOptions {
	return &goredis.FailoverOptions{
		MasterName:       MasterName,
		SentinelAddrs:    g.SentinelAddrs(),
		SentinelPassword: g.Sentinels[0].cfg.password,
		Password:         g.Data[0].cfg.password,
		DialTimeout:      2 * time.Second,
		ReadTimeout:      2 * time.Second,
		WriteTimeout:     2 * time.Second,
		PoolSize:         4,
	}
}

// MasterAddr asks the sentinels (first that answers) for the current
// master's address.
func (g *SentinelGroup) MasterAddr(ctx context.Context) (string, error) {
	var last error
	for _, s := range g.Sentinels {
		if !s.Alive() {
			continue
		}
		v, err := s.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil {
			last = err
			continue
		}
		hp, _ := v.([]any)
		if len(hp) != 2 {
			last = fmt.Errorf("redistest: unexpected reply %v", v)
			continue
		}
		return net.JoinHostPort(fmt.Sprint(hp[0]), fmt.Sprint(hp[1])), nil
	}
	if last == nil {
		last = fmt.Errorf("redistest: no live sentinel")
	}
	return "", last
}

// Master returns the data server that is the sentinels' current master.
func (g *SentinelGroup) Master() *Server {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addr, err := g.MasterAddr(ctx)
	if err != nil {
		g.t.Fatalf("redistest: master address: %v", err)
	}
	for _, d := range g.Data {
		if d.Addr() == addr {
			return d
		}
	}
	g.t.Fatalf("redistest: master %s is not one of the data servers", addr)
	return nil
}

// KillMaster SIGKILLs the current master and returns it.
func (g *SentinelGroup) KillMaster() *Server {
	g.t.Helper()
	m := g.Master()
	m.Kill()
	return m
}

// WaitFailover waits (up to timeout) until the sentinels name a master other
// than old and that server answers ROLE as a master; it returns the new
// master.
func (g *SentinelGroup) WaitFailover(old *Server, timeout time.Duration) *Server {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addr, err := g.MasterAddr(ctx)
		if err == nil && addr != old.Addr() {
			for _, d := range g.Data {
				if d.Addr() != addr {
					continue
				}
				role, rerr := d.Do(ctx, "ROLE")
				if rerr == nil {
					if r, _ := role.([]any); len(r) > 0 && fmt.Sprint(r[0]) == "master" {
						cancel()
						return d
					}
				}
				err = fmt.Errorf("redistest: %s not master yet: %v %v", addr, role, rerr)
			}
		} else if err == nil {
			err = fmt.Errorf("redistest: master still %s", addr)
		}
		cancel()
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range g.Sentinels {
		g.t.Log(s.LogTail(15))
	}
	g.t.Fatalf("redistest: no failover after %v: %v", timeout, last)
	return nil
}

func (g *SentinelGroup) waitConverged() {
	g.t.Helper()
	deadline := time.Now().Add(2 * StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if last = g.converged(); last == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range g.Sentinels {
		g.t.Log(s.LogTail(15))
	}
	g.t.Fatalf("redistest: sentinels did not converge: %v", last)
}

func (g *SentinelGroup) converged() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := g.Data[1].Do(ctx, "INFO", "replication")
	if err != nil {
		return err
	}
	if !strings.Contains(fmt.Sprint(info), "master_link_status:up") {
		return fmt.Errorf("replica %s not in sync", g.Data[1].Addr())
	}
	for _, s := range g.Sentinels {
		v, err := s.Do(ctx, "SENTINEL", "CKQUORUM", MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr(), err)
		}
		if want := len(g.Sentinels); !strings.Contains(fmt.Sprint(v), strconv.Itoa(want)+" usable") {
			return fmt.Errorf("sentinel %s: %v", s.Addr(), v)
		}
		reps, err := s.Do(ctx, "SENTINEL", "REPLICAS", MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr(), err)
		}
		if !strings.Contains(fmt.Sprint(reps), strconv.Itoa(g.Data[1].port)) {
			return fmt.Errorf("sentinel %s does not know replica %s yet", s.Addr(), g.Data[1].Addr())
		}
	}
	return nil
}
