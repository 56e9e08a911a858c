package redis_test

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// tlsCase is a TLS server setup of the TLS tests.
type tlsCase struct {
	name    string
	proto   string // tls-protocols
	version uint16 // negotiated version
	mutual  bool   // tls-auth-clients yes, the client presents its certificate
}

var tlsCases = []tlsCase{
	{"TLS1.2", "TLSv1.2", tls.VersionTLS12, false},
	{"TLS1.3", "TLSv1.3", tls.VersionTLS13, false},
	{"TLS1.2-mutual", "TLSv1.2", tls.VersionTLS12, true},
	{"TLS1.3-mutual", "TLSv1.3", tls.VersionTLS13, true},
}

// start starts the case's server and returns it with Store options for it:
// DefaultOptions (10 ms Timeout, RESP3) plus the URL and TLS files.
func (c tlsCase) start(t *testing.T) (*redistest.Server, redis.Options) {
	t.Helper()
	opts := []redistest.Option{redistest.WithTLSProtocols(c.proto)}
	if c.mutual {
		opts = append(opts, redistest.WithTLSClientAuth())
	}
	s := redistest.Standalone(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if v, err := s.TLSVersion(ctx); err != nil || v != c.version {
		t.Fatalf("server negotiates TLS %x (%v), want %x", v, err, c.version)
	}
	o := redis.DefaultOptions()
	o.URL = s.URL()
	o.TLSCAFile = s.TLS().CAFile
	if c.mutual {
		o.TLSCertFile, o.TLSKeyFile = s.TLS().ClientCertFile, s.TLS().ClientKeyFile
	}
	return s, o
}

// TestStoreTLSDefaultTimeout: over TLS 1.2 and 1.3, with and without a
// client certificate, at the default 10 ms Timeout with RESP3:
//
//   - (a) a Store with DefaultOptions becomes healthy;
//   - (b) a Store with the breaker disabled decides 200 sequential and 200
//     concurrent Takes with exact counts, every one succeeding or timing
//     out (scheduling delay misses the 10 ms now and then), and some of
//     each phase succeeding (without opaqueTLSConn: none);
//   - (c) on at most PoolSize connections plus one per failed Take (the
//     server's total_connections_received): connections are not
//     discarded and redialed.
//
// Over TLS 1.3 this needs the dialer's opaque connections (client.go,
// opaqueTLSConn): without them the first command of every connection waits
// 50 ms in go-redis' push-message check, so every call times out and
// every call dials a new connection, and (a) fails.
func TestStoreTLSDefaultTimeout(t *testing.T) {
	redistest.Require(t)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: time.Hour}
	take := func(s *redis.Store, key string, cost int64) (algo.Decision, error) {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{{Key: key, Limit: l, Cost: cost}})
		if err != nil {
			return algo.Decision{}, err
		}
		return d[0], nil
	}
	newStore := func(t *testing.T, o redis.Options) *redis.Store {
		t.Helper()
		return openStore(t, o)
	}
	for _, c := range tlsCases {
		t.Run(c.name, func(t *testing.T) {
			srv, o := c.start(t)
			if o.Timeout != redis.DefaultTimeout {
				t.Fatalf("Timeout %v, want the default %v", o.Timeout, redis.DefaultTimeout)
			}
			ctl := srv.Client()

			// (a) Healthy, and a Take succeeds. The first one may miss the
			// 10 ms (it may dial, and EVAL compiles the script), so this
			// retries for up to 20 s; without opaqueTLSConn none ever
			// succeeds and the circuit stays open.
			before := connectionsReceived(t, ctl) // ctl's own connection included
			s := newStore(t, o)
			deadline := time.Now().Add(20 * time.Second)
			attempts := 0
			for {
				attempts++
				_, err := take(s, "warm", 1)
				if err == nil && s.Healthy() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no successful Take in 20 s (%d attempts, %d dials): last %v (cause %q), healthy %v",
						attempts, connectionsReceived(t, ctl)-before, err, redis.CauseOf(err), s.Healthy())
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("healthy after %d attempt(s), %d dials", attempts, connectionsReceived(t, ctl)-before)
			_ = s.Close()

			// (b) Sequential, then concurrent, with the breaker disabled:
			// scheduling delay can stall a call past the 10 ms now and then,
			// which would open the circuit and fail the calls after it
			// too. A Take may time out (any other error fails the test),
			// and some of each phase must succeed (without opaqueTLSConn:
			// none; the mechanism itself is TestTLSDialerConnIsOpaque's).
			// Counts are exact, but a timed-out Take may still have been
			// applied by Redis.
			o.Breaker.Disabled = true
			before = connectionsReceived(t, ctl)
			s = newStore(t, o)
			const n, workers = 200, 8
			var mu sync.Mutex
			failed := map[string]int{}
			note := func(phase string, err error) {
				if c := redis.CauseOf(err); c != redis.CauseTimeout {
					t.Errorf("%s Take: %v (cause %q), want success or a timeout", phase, err, c)
				}
				mu.Lock()
				failed[phase]++
				mu.Unlock()
			}
			var last algo.Decision
			for range n {
				d, err := take(s, "seq", 1)
				if err != nil {
					note("sequential", err)
					continue
				}
				if !d.Allowed || (last.Allowed && d.Remaining >= last.Remaining) {
					t.Fatalf("sequential Take: %+v after %+v, want allowed with fewer remaining", d, last)
				}
				last = d
			}
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range n / workers {
						if d, err := take(s, "conc", 1); err != nil {
							note("concurrent", err)
						} else if !d.Allowed {
							t.Errorf("concurrent Take denied: %+v", d)
						}
					}
				})
			}
			wg.Wait()
			checks := 0
			for phase, key := range map[string]string{"sequential": "seq", "concurrent": "conc"} {
				f := failed[phase]
				t.Logf("%d %s Takes: %d timed out", n, phase, f)
				if f == n {
					t.Errorf("all %d %s Takes failed, want successes", n, phase)
				}
				checks++
				d, err := take(s, key, 0) // check only
				if err != nil {
					note(phase, err)
				} else if used := l.Rate - d.Remaining; used < int64(n-f) || used > n {
					t.Errorf("%s: %d units used by %d Takes of which %d failed", key, used, n, f)
				}
			}

			// (c) Dials: the pool holds at most PoolSize connections, and
			// go-redis discards one only after a failed call on it.
			dials := connectionsReceived(t, ctl) - before
			failures := failed["sequential"] + failed["concurrent"]
			t.Logf("%d dials for %d Takes (pool size %d, min idle %d, pipelines %d)", dials, 2*n+checks, o.PoolSize, o.MinIdleConns, redis.DefaultPipelines)
			if dials > o.PoolSize+failures {
				t.Errorf("%d dials for %d Takes, want <= pool size %d + %d failed Takes", dials, 2*n+checks, o.PoolSize, failures)
			}
		})
	}
}

// TestTLSDialerConnIsOpaque: the connections NewClient dials over TLS
// expose their TLS state but neither their socket (syscall.Conn) nor the
// TCP connection beneath TLS (NetConn), and their SyscallConn only tells
// end of stream, so go-redis never peeks beneath TLS (see opaqueTLSConn);
// commands on them work.
func TestTLSDialerConnIsOpaque(t *testing.T) {
	redistest.Require(t)
	for _, c := range tlsCases {
		t.Run(c.name, func(t *testing.T) {
			_, o := c.start(t)
			o.Timeout, o.DialTimeout, o.MinIdleConns = 2*time.Second, 2*time.Second, 0 // the shape, not latency
			client := newClient(t, o)
			var mu sync.Mutex
			var conns []net.Conn
			client.AddHook(dialRecorder(func(cn net.Conn) {
				mu.Lock()
				conns = append(conns, cn)
				mu.Unlock()
			}))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := client.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(conns) != 1 {
				t.Fatalf("%d dials for one PING, want 1", len(conns))
			}
			cn := conns[0]
			if _, ok := cn.(interface{ NetConn() net.Conn }); ok {
				t.Errorf("%T exposes NetConn", cn)
			}
			// SyscallConn tells only end of stream: go-redis' checks never
			// get to read the socket beneath TLS.
			sc, ok := cn.(syscall.Conn)
			if !ok {
				t.Fatalf("%T has no SyscallConn (its end-of-stream check)", cn)
			}
			rc, err := sc.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			called := false
			if err := rc.Read(func(uintptr) bool { called = true; return true }); err != nil || called {
				t.Errorf("SyscallConn().Read on a live TLS connection: err %v, ran the caller's function on the socket: %v", err, called)
			}
			st, ok := cn.(interface{ ConnectionState() tls.ConnectionState })
			if !ok {
				t.Fatalf("%T has no ConnectionState", cn)
			}
			if v := st.ConnectionState().Version; v != c.version {
				t.Errorf("negotiated TLS %x, want %x", v, c.version)
			}
		})
	}
}

// dialRecorder is a go-redis hook that passes every dialed connection to
// record.
type dialRecorder func(net.Conn)

func (r dialRecorder) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := next(ctx, network, addr)
		if err == nil {
			r(cn)
		}
		return cn, err
	}
}

func (dialRecorder) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (dialRecorder) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// connectionsReceived is the server's INFO stats total_connections_received
// (connections accepted since start, TLS handshake failures included).
func connectionsReceived(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO total_connections_received: %q", v)
			}
			return n
		}
	}
	t.Fatalf("INFO stats has no total_connections_received:\n%s", info)
	return 0
}
