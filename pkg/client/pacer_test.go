package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/client"
)

// upstream is a third-party API that enforces its own limit with pkg/algo,
// answering 429 with Retry-After when it is exceeded, and optionally the
// RateLimit and RateLimit-Policy fields.
type upstream struct {
	mu      sync.Mutex
	limit   algo.Limit
	state   algo.State
	headers bool // send RateLimit / RateLimit-Policy
	ok, rej atomic.Int64
	latency time.Duration // each way
	arrived []time.Time
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	u.mu.Lock()
	st, d := algo.Take(u.limit, u.state, now, 1)
	u.state = st
	u.arrived = append(u.arrived, now)
	u.mu.Unlock()
	if u.headers {
		_, end := algo.WindowBoundsUs(u.limit, now.UnixMicro())
		t := (end - now.UnixMicro() + 999_999) / 1_000_000
		w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"api";q=%d;w=%d`, u.limit.Rate, int64(u.limit.Period/time.Second)))
		w.Header().Set("RateLimit", fmt.Sprintf(`"api";r=%d;t=%d`, d.Remaining, t))
	}
	if !d.Allowed {
		u.rej.Add(1)
		w.Header().Set("Retry-After", fmt.Sprint(int64((d.RetryAfter+time.Second-1)/time.Second)))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	u.ok.Add(1)
	w.WriteHeader(http.StatusOK)
}

// RoundTrip serves the request in memory after the one-way latency, and
// returns the answer after it again, so that the test runs in synctest's
// virtual time.
func (u *upstream) RoundTrip(r *http.Request) (*http.Response, error) {
	skew, _ := strconv.Atoi(r.Header.Get(workerHeader))
	time.Sleep(u.latency + time.Duration(skew)*time.Microsecond)
	rec := httptest.NewRecorder()
	u.ServeHTTP(rec, r)
	time.Sleep(u.latency + time.Duration(skew)*time.Microsecond)
	return rec.Result(), nil
}

// workerHeader carries a call's worker number w: the upstream and the
// worker's pause each take w µs longer, so that no two workers' calls
// reach the upstream or come back at the same instant.
const workerHeader = "X-Test-Worker"

// drive runs workers that each call the upstream through the pacer every
// interval (offering workers/interval calls per second) for d.
func drive(t *testing.T, c *http.Client, workers int, interval, d time.Duration) (queueFull int64) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var full atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
				req.Header.Set(workerHeader, strconv.Itoa(w))
				resp, err := c.Do(req)
				switch {
				case errors.Is(err, client.ErrQueueFull):
					full.Add(1)
				case err == nil:
					_ = resp.Body.Close()
				}
				time.Sleep(interval + time.Duration(w)*time.Microsecond)
			}
		})
	}
	wg.Wait()
	return full.Load()
}

// TestPacingAgainstLimitingUpstream offers 3× an upstream's limit for 30 s
// (virtual time) through a Pacer configured with the published limit and
// the default 10 % margin: the upstream answers no 429, and the calls it
// admits reach at least 85 % of its limit.
func TestPacingAgainstLimitingUpstream(t *testing.T) {
	const rate, run = 100, 30 * time.Second
	for _, tc := range []struct {
		name     string
		upstream algo.Limit
		burst    int64 // the burst the client is configured with
		headers  bool
	}{
		{"token bucket, burst then throttle", algo.Limit{Kind: algo.TokenBucket, Rate: rate, Period: time.Second, Burst: rate}, rate, false},
		{"fixed window", algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Second}, 5, false},
		{"fixed window with RateLimit fields", algo.Limit{Kind: algo.FixedWindow, Rate: rate, Period: time.Second}, 5, true},
		{"sliding window", algo.Limit{Kind: algo.SlidingWindow, Rate: rate, Period: time.Second}, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := &upstream{limit: tc.upstream, headers: tc.headers, latency: 7 * time.Millisecond}
				p := client.New(client.Options{Limiter: client.NewLocal(rate, time.Second, tc.burst, 0.1)})
				c := &http.Client{Transport: &client.Transport{Base: up, Pacer: p}}
				full := drive(t, c, 30, 100*time.Millisecond, run) // 300 calls/s offered
				if n := up.rej.Load(); n != 0 {
					t.Errorf("upstream answered %d × 429; want 0", n)
				}
				if ok, want := up.ok.Load(), int64(0.85*rate*run.Seconds()); ok < want {
					t.Errorf("upstream admitted %d calls in %v; want ≥ %d (85 %% of its limit)", ok, run, want)
				}
				if full != 0 {
					t.Errorf("%d calls refused by a full queue; want 0 (30 callers, queue 1024)", full)
				}
			})
		})
	}
}

// TestResyncFromHeaders configures the client with 10× the upstream's real
// limit: the RateLimit-Policy and RateLimit fields of the first answers
// bring it under the real limit, so that after the first window the
// upstream answers no 429 and every window admits the resynced 90.
func TestResyncFromHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &upstream{limit: algo.Limit{Kind: algo.FixedWindow, Rate: 100, Period: time.Second}, headers: true, latency: 7 * time.Millisecond}
		local := client.NewLocal(1000, time.Second, 1000, 0.1)
		p := client.New(client.Options{Limiter: local})
		c := &http.Client{Transport: &client.Transport{Base: up, Pacer: p}}
		drive(t, c, 30, 100*time.Millisecond, 2*time.Second)
		if got := local.Limit(); got.Rate != 90 || got.Period != time.Second {
			t.Fatalf("after resync the bucket is %d per %v; want 90 per 1s", got.Rate, got.Period)
		}
		first, from := up.rej.Load(), time.Now()
		drive(t, c, 30, 100*time.Millisecond, 20*time.Second)
		if n := up.rej.Load() - first; n != 0 {
			t.Errorf("after resync the upstream answered %d × 429; want 0", n)
		}
		// Every whole window after the resync admits the resynced rate: a
		// spent window's hold ends with it, so none is cut short.
		per := map[int64]int{}
		for _, a := range up.arrived {
			per[a.Unix()]++
		}
		for s := from.Unix() + 1; s < from.Add(20*time.Second).Unix(); s++ {
			if per[s] < 90 {
				t.Errorf("window %d after the resync admitted %d calls; want ≥ 90", s-from.Unix(), per[s])
			}
		}
		if ok := up.ok.Load(); ok < int64(0.85*100*20) {
			t.Errorf("upstream admitted %d calls in 22 s; want ≥ %d", ok, int64(0.85*100*20))
		}
	})
}

// TestRetryAfterHoldsEveryCaller answers the first call with 429 and
// Retry-After: 2; no call reaches the upstream until 2 s later, and all
// go within 2 s plus the 10 % jitter.
func TestRetryAfterHoldsEveryCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var at []time.Time
		start := time.Now()
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			at = append(at, time.Now())
			first := len(at) == 1
			mu.Unlock()
			if first {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(http.StatusTooManyRequests)
			}
		})
		p := client.New(client.Options{Limiter: client.NewLocal(1000, time.Second, 1000, 0)})
		c := &http.Client{Transport: &client.Transport{Base: handlerTransport{h}, Pacer: p}}
		resp, err := c.Get("http://upstream.test/")
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("first call: %v %v; want the upstream's 429", resp, err)
		}
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				if resp, err := c.Get("http://upstream.test/"); err == nil {
					_ = resp.Body.Close()
				}
			})
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, a := range at[1:] {
			if d := a.Sub(start); d < 2*time.Second || d > 2200*time.Millisecond {
				t.Errorf("a call reached the upstream %v after the 429; want in [2 s, 2.2 s]", d)
			}
		}
		if len(at) != 11 {
			t.Errorf("%d calls reached the upstream; want 11", len(at))
		}
	})
}

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// TestQueueBoundAndCancel: callers beyond MaxQueue fail at once with
// ErrQueueFull, and a waiting caller whose context ends leaves the queue
// with the context's error, making room for another.
func TestQueueBoundAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := client.NewLocal(1, time.Hour, 1, 0) // one call, then one per hour
		p := client.New(client.Options{Limiter: l, MaxQueue: 2})
		if err := p.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- p.Wait(ctx, 1) }()
		}
		synctest.Wait() // both queued
		if err := p.Wait(context.Background(), 1); !errors.Is(err, client.ErrQueueFull) {
			t.Fatalf("third waiter: %v; want ErrQueueFull", err)
		}
		cancel()
		for range 2 {
			if err := <-errs; !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled waiter: %v; want context.Canceled", err)
			}
		}
		short, cancel2 := context.WithTimeout(context.Background(), time.Minute)
		defer cancel2()
		if err := p.Wait(short, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiter after the cancelled ones: %v; want its own deadline (the queue has room again)", err)
		}
	})
}

// TestBadInput: a cost above the bucket's capacity fails at once instead
// of blocking the queue until its context ends, a negative cost is
// refused, and nonsensical bucket settings panic.
func TestBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := client.New(client.Options{Limiter: client.NewLocal(10, time.Second, 5, 0)})
		if err := p.Wait(context.Background(), 6); !errors.Is(err, client.ErrCostOverBurst) {
			t.Errorf("cost 6 on a bucket of 5: %v; want ErrCostOverBurst", err)
		}
		if err := p.Wait(context.Background(), -1); !errors.Is(err, client.ErrNegativeCost) {
			t.Errorf("cost -1: %v; want ErrNegativeCost", err)
		}
		start := time.Now()
		if err := p.Wait(context.Background(), 1); err != nil || time.Since(start) != 0 {
			t.Errorf("cost 1 after the refusals: %v after %v; want admitted at once", err, time.Since(start))
		}
	})
	for _, c := range []struct {
		rate, burst int64
		period      time.Duration
		margin      float64
	}{{0, 0, time.Second, 0.1}, {10, 0, 0, 0.1}, {10, -1, time.Second, 0.1}, {10, 0, time.Second, 1.5}, {10, 0, time.Second, -0.1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewLocal(%d, %v, %d, %v) did not panic", c.rate, c.period, c.burst, c.margin)
				}
			}()
			client.NewLocal(c.rate, c.period, c.burst, c.margin)
		}()
	}
}
