package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/client"
)

// gridAPI is a RoundTripper for an API that allows q calls per fixed
// 1-second window, windows aligned to whole seconds, and says so in the
// IETF RateLimit-Policy and RateLimit fields, with t the whole seconds until the window ends,
// rounded up (so t=1 however little of the window is left). It answers
// after latency each way (or as latencyHeader says), in virtual time.
type gridAPI struct {
	q       int64
	latency time.Duration

	mu      sync.Mutex
	win     int64           // index of the current window
	n       int64           // calls counted in it
	ok      map[int64]int64 // admitted calls by window index
	rejects int64
}

func (a *gridAPI) RoundTrip(r *http.Request) (*http.Response, error) {
	out, back := a.latency, a.latency
	if v := r.Header.Get(latencyHeader); v != "" {
		_, _ = fmt.Sscanf(v, "%d %d", &out, &back)
	}
	time.Sleep(out)
	now := time.Now()
	rec := httptest.NewRecorder()
	a.mu.Lock()
	if win := now.Unix(); win != a.win {
		a.win, a.n = win, 0
	}
	a.n++
	t := int64((time.Unix(a.win+1, 0).Sub(now) + time.Second - 1) / time.Second)
	rec.Header().Set("RateLimit-Policy", fmt.Sprintf(`"api";q=%d;w=1`, a.q))
	rec.Header().Set("RateLimit", fmt.Sprintf(`"api";r=%d;t=%d`, max(a.q-a.n, 0), t))
	if a.n > a.q {
		a.rejects++
		rec.Header().Set("Retry-After", fmt.Sprint(t))
		rec.WriteHeader(http.StatusTooManyRequests)
	} else {
		a.ok[a.win]++
	}
	a.mu.Unlock()
	time.Sleep(back)
	return rec.Result(), nil
}

// admitAll is a Limiter that admits every call, so that only the
// upstream's fields pace them.
type admitAll struct{}

func (admitAll) Take(context.Context, time.Time, int64) (bool, time.Duration, error) {
	return true, 0, nil
}

// latencyHeader overrides a gridAPI call's latency: "out back", each in
// nanoseconds.
const latencyHeader = "X-Test-Latency"

// TestSpentQuotaHoldEndsWithTheWindow: an API allows 10 calls per 1-s
// window. Nine calls early in window 0 leave r=1 and tell the pacer that
// the window ends within a second of the first answer; the tenth call
// reaches the API 1 ms before the window ends and comes back with r=0, t=1.
// That t alone would put the reset anywhere up to 1 s after the answer,
// and a hold that long (plus jitter) would lose window 1 entirely. The
// earlier answers of the same window bound the reset, so the hold ends
// within window 1's first tenth: window 1 admits its whole quota less the
// margin, and the API answers no 429.
func TestSpentQuotaHoldEndsWithTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const q = 10
		lat := time.Millisecond
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		w0 := time.Now().Unix()
		api := &gridAPI{q: q, latency: lat, win: -1, ok: map[int64]int64{}}
		p := client.New(client.Options{Limiter: admitAll{}})
		c := &http.Client{Transport: &client.Transport{Base: api, Pacer: p}}
		call := func(ctx context.Context) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
			resp, err := c.Do(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}
		for range q - 1 {
			if err := call(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Until(time.Unix(w0+1, 0).Add(-lat - time.Millisecond)))
		if err := call(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithDeadline(context.Background(), time.Unix(w0+2, 0))
		defer cancel()
		for call(ctx) == nil {
		}
		api.mu.Lock()
		defer api.mu.Unlock()
		if api.ok[w0] != q {
			t.Fatalf("window 0 admitted %d calls; want %d (the setup)", api.ok[w0], q)
		}
		if api.rejects != 0 {
			t.Errorf("API answered %d × 429; want 0", api.rejects)
		}
		if got, want := api.ok[w0+1], int64(q-q/10); got < want {
			t.Errorf("window 1 admitted %d calls; want ≥ %d (its quota less the 10 %% margin)", got, want)
		}
	})
}

// TestHoldNotShortenedAcrossAReset: the bound an answer gives on its
// window's end must not carry over to the next window. One call in the
// middle of window 0 leaves r=9, so window 0 ends within a second of it.
// Five calls sent just before window 0 ends all reach the API in window 1,
// and come back in the reverse order: the first answer says r=5, lower
// than 9, as if window 0 went on. But these five calls can all have
// reached the API since the r=9 answer, and in window 0 they would have
// left 4, so r=5 may be a new window: the pacer takes the reset from the
// new answer alone. Callers then spend window 1, and the hold on r=0 lasts
// until window 1 ends. The API answers no 429.
func TestHoldNotShortenedAcrossAReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const q, batch = 10, 5
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		w0 := time.Now().Unix()
		api := &gridAPI{q: q, latency: time.Millisecond, win: -1, ok: map[int64]int64{}}
		p := client.New(client.Options{Limiter: admitAll{}})
		c := &http.Client{Transport: &client.Transport{Base: api, Pacer: p}}
		call := func(ctx context.Context, out, back time.Duration) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
			if out > 0 {
				req.Header.Set(latencyHeader, fmt.Sprintf("%d %d", out, back))
			}
			resp, err := c.Do(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}
		time.Sleep(500 * time.Millisecond)
		if err := call(context.Background(), 0, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(time.Unix(w0+1, 0).Add(-10 * time.Millisecond)))
		// Call i reaches the API 11+i ms later, in window 1, and comes back
		// 20-2i ms after that: the last one counted is the first answered.
		var wg sync.WaitGroup
		for i := range time.Duration(batch) {
			wg.Go(func() {
				if err := call(context.Background(), (11+i)*time.Millisecond, (20-2*i)*time.Millisecond); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		ctx, cancel := context.WithDeadline(context.Background(), time.Unix(w0+2, 0).Add(500*time.Millisecond))
		defer cancel()
		for range 3 {
			wg.Go(func() {
				for call(ctx, 0, 0) == nil {
				}
			})
		}
		wg.Wait()
		api.mu.Lock()
		defer api.mu.Unlock()
		if api.ok[w0] != 1 {
			t.Fatalf("window 0 admitted %d calls; want 1 (the setup)", api.ok[w0])
		}
		if api.rejects != 0 {
			t.Errorf("API answered %d × 429 (admitted by window %v); want 0", api.rejects, api.ok)
		}
		if api.ok[w0+1] < q-1 || api.ok[w0+2] == 0 {
			t.Errorf("API admitted %v by window; want ≥ %d in window 1 and some in window 2", api.ok, q-1)
		}
	})
}

// TestHoldBoundIsPerQuota: a bound on one quota's reset does not shorten
// the hold on another. The first answer says quota "a" has 9 left and
// resets within a second; the second, 900 ms later, says quota "b" is spent
// and resets in t=1. Quota b's window may end up to a second after that
// answer, so the next call waits that long, not just until quota a's
// bound.
func TestHoldBoundIsPerQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var at []time.Time
		fields := []string{`"a";r=9;t=1, "b";r=50;t=60`, `"a";r=8;t=1, "b";r=0;t=1`}
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if n := len(at); n < len(fields) {
				w.Header().Set("RateLimit", fields[n])
			}
			at = append(at, time.Now())
		})
		p := client.New(client.Options{Limiter: admitAll{}})
		c := &http.Client{Transport: &client.Transport{Base: handlerTransport{h}, Pacer: p}}
		for i := range 3 {
			if i == 1 {
				time.Sleep(900 * time.Millisecond)
			}
			resp, err := c.Get("http://upstream.test/")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
		}
		if d := at[2].Sub(at[1]); d < time.Second {
			t.Errorf("third call %v after quota b was spent with t=1; want ≥ 1s", d)
		}
	})
}
