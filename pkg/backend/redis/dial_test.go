package redis_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// slowDial is how long the proxies of TestSlowDialWithinBudget hold a
// reply of the server: longer than DefaultDialTimeout, far shorter than
// the calls' budget.
const slowDial = 2 * redis.DefaultDialTimeout

// TestSlowDialWithinBudget: a dial that takes longer than
// --redis-dial-timeout fails no call whose budget
// has room for it. 32 concurrent calls without a deadline (budget
// MaxWait, 10 s here) on a Store that has no connection yet are all
// decided when
//   - sentinel: every new connection to the master first asks a sentinel
//     for the master's address, within the dial, and every sentinel reply
//     takes slowDial;
//   - tls: the server's first TLS handshake flight on every connection
//     takes slowDial.
func TestSlowDialWithinBudget(t *testing.T) {
	redistest.Require(t)
	t.Run("sentinel", func(t *testing.T) {
		g := redistest.Sentinel(t)
		var addrs []string
		for _, a := range g.SentinelAddrs() {
			addrs = append(addrs, delayProxy(t, a, slowDial, false))
		}
		o := redis.DefaultOptions()
		o.Mode, o.URL, o.Addrs, o.MasterName = redis.Sentinel, "", addrs, redistest.MasterName
		decideAll(t, o)
	})
	t.Run("tls", func(t *testing.T) {
		srv := redistest.Standalone(t, redistest.WithTLS())
		o := redis.DefaultOptions()
		o.URL = strings.Replace(srv.URL(), srv.Addr(), delayProxy(t, srv.Addr(), slowDial, true), 1)
		o.TLSCAFile = srv.TLS().CAFile
		decideAll(t, o)
	})
}

// decideAll opens a Store with o (MaxWait 10 s) and fails t unless 32
// concurrent calls without a deadline are all decided.
func decideAll(t *testing.T, o redis.Options) {
	t.Helper()
	o.MaxWait = 10 * time.Second
	s := openStore(t, o)
	lim := algo.Limit{Kind: algo.FixedWindow, Rate: 1 << 30, Period: time.Hour}
	const calls = 32
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			_, errs[i] = algotest.Take(context.Background(), s, []algo.Hit{{Key: "slow-dial-" + strconv.Itoa(i), Limit: lim, Cost: 1}})
		})
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				t.Errorf("call %d: %v (cause %s)", i, err, redis.CauseOf(err))
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d calls without a deadline failed while dials took %v", failed, calls, slowDial)
	}
}

// delayProxy listens on a loopback port and forwards every connection to
// addr, holding each chunk the server sends (only the first one when
// first) for delay before passing it on; it returns its address and
// stops when t ends.
func delayProxy(t testing.TB, addr string, delay time.Duration, first bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = down.Close()
				continue
			}
			if !track(down) || !track(up) {
				_ = down.Close()
				_ = up.Close()
				return
			}
			wg.Go(func() {
				_, _ = io.Copy(up, down)
				_ = up.Close()
			})
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for held := false; ; {
					n, err := up.Read(buf)
					if n > 0 {
						if !first || !held {
							time.Sleep(delay)
							held = true
						}
						if _, werr := down.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						if !errors.Is(err, io.EOF) {
							_ = up.Close()
						}
						break
					}
				}
				_ = down.Close()
			})
		}
	})
	return ln.Addr().String()
}
