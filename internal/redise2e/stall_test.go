package redise2e

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// holdProxy is a TCP proxy to a Redis that can stop forwarding while it
// keeps every connection open (a path that drops packets): while held,
// bytes read on either side wait in the proxy, and new connections are
// accepted but not forwarded; Release delivers them in order, as TCP
// would once the path works again.
type holdProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	held     bool
	release  chan struct{} // closed by Release
	conns    []net.Conn
	wg       sync.WaitGroup
}

// newHoldProxy listens on a free loopback port and forwards to upstream;
// it stops at the end of the test.
func newHoldProxy(t testing.TB, upstream string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, upstream: upstream, release: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's "host:port".
func (p *holdProxy) Addr() string { return p.ln.Addr().String() }

// Hold stops forwarding.
func (p *holdProxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held, p.release = true, make(chan struct{})
	}
}

// Release forwards again, what was held first.
func (p *holdProxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		close(p.release)
	}
}

// wait blocks while the proxy holds.
func (p *holdProxy) wait() {
	p.mu.Lock()
	held, ch := p.held, p.release
	p.mu.Unlock()
	if held {
		<-ch
	}
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.wg.Go(func() {
			p.wait()
			u, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, u)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(u, c) })
			p.pipe(c, u)
		})
	}
}

// pipe copies src to dst, each chunk after the proxy stops holding.
func (p *holdProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: close both sides
		}
	}
}

func (p *holdProxy) close() {
	_ = p.ln.Close()
	p.Release()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// stallN is how many calls per rule each check of
// TestStalledRedisGetsFailureModes makes once the stall is established.
const stallN = 30

// TestStalledRedisGetsFailureModes: Redis stops answering without closing
// its connections (SIGSTOP, or holdProxy), with Envoy's 20 ms deadline
// and without one. Once the stall has lasted the breaker's fail-for,
// every call gets its rule's failure mode as for a dead Redis: all stallN
// open calls answer OK uncounted, all stallN closed calls are denied,
// none shed, each with cause stalled; without a deadline each answers
// within --redis-max-wait. Then Redis answers again and decisions are
// counted.
func TestStalledRedisGetsFailureModes(t *testing.T) {
	redistest.Require(t)
	for _, fault := range []string{"sigstop", "proxy"} {
		for _, deadline := range []time.Duration{frozenDeadline, 0} {
			name := fault + "/deadline_" + deadline.String()
			if deadline == 0 {
				name = fault + "/no_deadline"
			}
			t.Run(name, func(t *testing.T) {
				srv := redistest.Standalone(t)
				url := srv.URL()
				var px *holdProxy
				if fault == "proxy" {
					px = newHoldProxy(t, srv.Addr())
					url = "redis://" + px.Addr()
				}
				o := standaloneOpts(url)
				in := newInstance(t, o, failureSet(t))
				warm(t, []*instance{in})
				waitFor(t, stateWithin, "Redis deciding before the fault", func() bool { return decided(t, in) })
				var restore func()
				if px != nil {
					px.Hold()
					restore = px.Release
				} else {
					srv.Stop()
					t.Cleanup(func() {
						if srv.Alive() {
							srv.Cont()
						}
					})
					restore = srv.Cont
				}
				budget := o.MaxWait
				if deadline > 0 {
					budget = deadline
				}
				ask := func(r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, time.Duration, error) {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if deadline > 0 {
						ctx, cancel = context.WithTimeout(ctx, deadline)
					}
					defer cancel()
					t0 := time.Now()
					resp, err := in.svc.ShouldRateLimit(ctx, r)
					return resp, time.Since(t0), err
				}
				// Establish the stall: calls (shed, or answered by
				// their modes) until the circuit opens on it.
				start := time.Now()
				waitFor(t, stateWithin, "the stall established (circuit open)", func() bool {
					_, _, _ = ask(req("load", []string{"closed", freshValue()}))
					return in.store.BreakerState() != "closed"
				})
				t.Logf("%s: stall established %v after the fault", name, time.Since(start).Round(time.Millisecond))

				c0 := causes(t, in.reg)
				var slowest time.Duration
				okOpen, deniedClosed, late := 0, 0, 0
				v := freshValue()
				for i := range stallN {
					// Spread over several OpenFor periods, so that
					// half-open probes are among the calls.
					time.Sleep(20 * time.Millisecond)
					r, d, err := ask(req("fm", []string{"open", v}))
					slowest = max(slowest, d)
					if d > budget {
						late++
					}
					if err != nil {
						t.Errorf("failure_mode open, call %d: %v (shed), want OK", i+1, err)
					} else if isOK(r) {
						okOpen++
					}
					r, d, err = ask(req("fm", []string{"closed", freshValue()}))
					slowest = max(slowest, d)
					if d > budget {
						late++
					}
					if err != nil {
						t.Errorf("failure_mode closed, call %d: %v, want OVER_LIMIT", i+1, err)
					} else if r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
						deniedClosed++
					}
				}
				c1 := causes(t, in.reg)
				t.Logf("%s: %d of %d open OK, %d of %d closed denied, slowest %v (budget %v), causes %v", name, okOpen, stallN, deniedClosed, stallN, slowest, budget, c1)
				if okOpen != stallN || deniedClosed != stallN {
					t.Errorf("stall established: %d of %d open calls OK and %d of %d closed calls denied, want all", okOpen, stallN, deniedClosed, stallN)
				}
				if d := c1[redis.CauseStalled] - c0[redis.CauseStalled]; d != 2*stallN {
					t.Errorf("cause stalled grew by %v over %d calls, want %d (causes %v, before %v)", d, 2*stallN, 2*stallN, c1, c0)
				}
				if deadline == 0 && late > 0 {
					t.Errorf("%d calls without a deadline took longer than their budget %v (slowest %v)", late, budget, slowest)
				}

				restore()
				took := waitFor(t, stateWithin, "normal answers after Redis answers again", func() bool { return decided(t, in) })
				t.Logf("%s: counted again %v after Redis answered", name, took.Round(time.Millisecond))
			})
		}
	}
}
