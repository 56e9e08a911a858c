package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/client"
)

// TestFieldsHoldCallers: the first answer carries one of the fields
// docs/pacing.md lists; the next call reaches the upstream no sooner than
// the field asks and no later than that plus the 10 % jitter. Malformed
// fields are ignored, and MaxWait caps what a field may ask for.
func TestFieldsHoldCallers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		fields   func(now time.Time) map[string]string
		maxWait  time.Duration
		min, max time.Duration
	}{
		{"Retry-After seconds", 429, func(time.Time) map[string]string { return map[string]string{"Retry-After": "3"} }, 0, 3 * time.Second, 3300 * time.Millisecond},
		{"Retry-After HTTP date", 503, func(now time.Time) map[string]string {
			return map[string]string{"Retry-After": now.Add(4 * time.Second).UTC().Format(http.TimeFormat)}
		}, 0, 4 * time.Second, 4400 * time.Millisecond},
		{"429 without a hint", 429, func(time.Time) map[string]string { return nil }, 0, time.Second, 1100 * time.Millisecond},
		{"503 without a hint", 503, func(time.Time) map[string]string { return nil }, 0, time.Second, 1100 * time.Millisecond},
		{"RateLimit r=0", 200, func(time.Time) map[string]string { return map[string]string{"RateLimit": `"api";r=0;t=2`} }, 0, 2 * time.Second, 2200 * time.Millisecond},
		{"X-RateLimit-Reset delta", 200, func(time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
		}, 0, 2 * time.Second, 2200 * time.Millisecond},
		{"X-RateLimit-Reset epoch", 200, func(now time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": fmt.Sprint(now.Unix() + 5)}
		}, 0, 5 * time.Second, 5500 * time.Millisecond},
		{"malformed RateLimit", 200, func(time.Time) map[string]string { return map[string]string{"RateLimit": `"api";r=0;t=2, (`} }, 0, 0, 0},
		{"negative remaining", 200, func(time.Time) map[string]string { return map[string]string{"RateLimit": `"api";r=-1;t=2`} }, 0, 0, 0},
		{"malformed Retry-After", 200, func(time.Time) map[string]string { return map[string]string{"Retry-After": "soon"} }, 0, 0, 0},
		{"MaxWait caps Retry-After", 429, func(time.Time) map[string]string { return map[string]string{"Retry-After": "86400"} }, time.Minute, time.Minute, 66 * time.Second},
		{"MaxWait default 1 h", 429, func(time.Time) map[string]string { return map[string]string{"Retry-After": "86400"} }, 0, time.Hour, 66 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var at []time.Time
				h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					now := time.Now()
					mu.Lock()
					at = append(at, now)
					first := len(at) == 1
					mu.Unlock()
					if first {
						for k, v := range tc.fields(now) {
							w.Header().Set(k, v)
						}
						w.WriteHeader(tc.status)
					}
				})
				// synctest's clock starts in 2000, before the epoch times
				// X-RateLimit-Reset is told apart by; move it to 2023.
				time.Sleep(time.Until(time.Unix(1_700_000_000, 0)))
				p := client.New(client.Options{Limiter: client.NewLocal(1000, time.Second, 1000, 0), MaxWait: tc.maxWait})
				c := &http.Client{Transport: &client.Transport{Base: handlerTransport{h}, Pacer: p}}
				for range 2 {
					resp, err := c.Get("http://upstream.test/")
					if err != nil {
						t.Fatal(err)
					}
					_ = resp.Body.Close()
				}
				if d := at[1].Sub(at[0]); d < tc.min || d > tc.max {
					t.Errorf("second call %v after the first; want in [%v, %v]", d, tc.min, tc.max)
				}
			})
		})
	}
}

// TestRemainingLessMarginGoesAtOnce: after an answer with RateLimit
// r=20;t=2 and the default 10 % margin, 18 of 30 waiting callers reach the
// upstream at once and the rest after the reset; with r=5, all 5 (the
// margin is rounded in the caller's favour).
func TestRemainingLessMarginGoesAtOnce(t *testing.T) {
	for _, tc := range []struct{ r, want int }{{20, 18}, {5, 5}, {1, 1}} {
		t.Run(fmt.Sprint("r=", tc.r), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var at []time.Duration
				start := time.Now()
				h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					mu.Lock()
					at = append(at, time.Since(start))
					first := len(at) == 1
					mu.Unlock()
					if first {
						w.Header().Set("RateLimit", fmt.Sprintf(`"api";r=%d;t=2`, tc.r))
					}
				})
				p := client.New(client.Options{Limiter: client.NewLocal(1000, time.Second, 1000, 0)})
				c := &http.Client{Transport: &client.Transport{Base: handlerTransport{h}, Pacer: p}}
				resp, err := c.Get("http://upstream.test/")
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				var wg sync.WaitGroup
				for range 30 {
					wg.Go(func() {
						if resp, err := c.Get("http://upstream.test/"); err == nil {
							_ = resp.Body.Close()
						}
					})
				}
				wg.Wait()
				soon := 0
				for _, d := range at[1:] {
					if d < 2*time.Second {
						soon++
					}
				}
				if soon != tc.want || len(at) != 31 {
					t.Errorf("%d of %d calls went before the reset; want %d of 30", soon, len(at)-1, tc.want)
				}
			})
		})
	}
}

// TestObserveWithoutTicketOnlyLowers: answers fed by hand through Observe
// cannot be told apart by age, so before the reset a higher remaining
// count does not raise the calls left; a lower one lowers them.
func TestObserveWithoutTicketOnlyLowers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := client.New(client.Options{Limiter: client.NewLocal(1000, time.Second, 1000, 0), Margin: -1})
		field := func(r int) http.Header {
			return http.Header{"Ratelimit": {fmt.Sprintf(`"api";r=%d;t=2`, r)}}
		}
		ctx := context.Background()
		for range 4 {
			if err := p.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		p.Observe(200, field(6)) // 6 less 3 in flight: 3 left
		p.Observe(200, field(8)) // older, or a reset: not raised
		p.Observe(200, field(3)) // 3 less 1 in flight: 2 left
		p.Observe(200, field(9)) // not raised
		start := time.Now()
		for i := range 3 {
			if err := p.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			if i < 2 && d != 0 || i == 2 && d < 2*time.Second {
				t.Errorf("call %d went after %v; want the first 2 at once and the third after the 2 s reset", i+1, d)
			}
			p.Done()
		}
	})
}

// TestDefaults: MaxQueue is 1024 by default; X-RateLimit-Limit with a w
// parameter, like RateLimit-Policy, resyncs a Local bucket to the lowest
// advertised rate less the margin.
func TestDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := client.New(client.Options{Limiter: client.NewLocal(1, time.Hour, 1, 0)})
		if err := p.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 1024 {
			wg.Go(func() { _ = p.Wait(ctx, 1) })
		}
		synctest.Wait()
		if err := p.Wait(context.Background(), 1); !errors.Is(err, client.ErrQueueFull) {
			t.Errorf("waiter 1025: %v; want ErrQueueFull", err)
		}
		cancel()
		wg.Wait()
	})
	for _, h := range []http.Header{
		{"X-Ratelimit-Limit": {"100, 20;w=1, 600;w=60"}},
		{"Ratelimit-Policy": {`"burst";q=20;w=1, "day";q=600;w=60`}},
	} {
		local := client.NewLocal(1000, time.Second, 1000, 0.1)
		p := client.New(client.Options{Limiter: local})
		p.Observe(200, h)
		if got := local.Limit(); got.Rate != 540 || got.Period != time.Minute {
			t.Errorf("after %v the bucket is %d per %v; want 540 per 1m0s (600 per minute less 10 %%)", h, got.Rate, got.Period)
		}
	}
}
