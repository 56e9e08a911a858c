package redis_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// slowProxy forwards TCP connections to a Redis server and holds every
// chunk of its replies for delay (set with setDelay) before passing it on:
// a Redis that answers, but slowly, as one starved of CPU does.
type slowProxy struct {
	ln       net.Listener
	upstream string
	delay    atomic.Int64 // ns
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newSlowProxy(t testing.TB, upstream string) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{ln: ln, upstream: upstream}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *slowProxy) addr() string             { return p.ln.Addr().String() }
func (p *slowProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *slowProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close() // Redis down: the client sees the connection end
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(u, c); _ = u.Close() })
		p.wg.Go(func() { p.replies(c, u); _ = c.Close() })
	}
}

// replies copies u's bytes to c, each chunk after the delay.
func (p *slowProxy) replies(c, u net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			time.Sleep(time.Duration(p.delay.Load()))
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestRecoverySlowRedis: Redis killed, the circuit open, then Redis
// started again but answering every command 100 ms late (a Redis starved
// of CPU with ratelimitd: it answers PING, slowly). The health probe's
// warm-up (a dial and several round trips, 250 ms at first) then runs out
// of time while Redis is answering it: that is no failure of Redis, so
// the circuit is not opened again, the probe gets more time and the Store
// turns healthy without any request; and 1 s after Redis answers, a
// decision with a deadline Redis can meet (500 ms) is counted.
func TestRecoverySlowRedis(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	p := newSlowProxy(t, srv.Addr())
	o := redis.DefaultOptions()
	o.URL = "redis://" + p.addr() + "/0"
	s := openStore(t, o)
	waitHealthy(t, s, true, stateWithin, "warm")
	srv.Kill()
	failWithTraffic(t, s, "killed")
	p.setDelay(100 * time.Millisecond)
	srv.Restart()
	answered := time.Now()
	opened := redis.BreakerOpened(s)
	took := waitHealthy(t, s, true, stateWithin, "restarted, slow")
	if n := redis.BreakerOpened(s) - opened; n > 0 {
		t.Errorf("the circuit opened %d more times after the slow Redis answered PING", n)
	}
	t.Logf("healthy %v after the slow Redis answered", took)
	time.Sleep(time.Until(answered.Add(time.Second)))
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}
	for i, want := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: "slowredis", Limit: l, Cost: 1}})
		cancel()
		if err != nil {
			t.Fatalf("Take %d, 1 s after the slow Redis answered: %v (cause %q)", i, err, redis.CauseOf(err))
		}
		if d[0].Allowed != want {
			t.Fatalf("Take %d allowed %v, want %v", i, d[0].Allowed, want)
		}
	}
}
