package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/client"
)

// pipeListener is a net.Listener whose connections are net.Pipe pairs, so
// that an httptest.Server and an http.Transport talk inside a synctest
// bubble: a goroutine blocked on a pipe is durably blocked, and virtual
// time advances.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// DialContext hands the server one end of a new pipe.
func (l *pipeListener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	srv, cli := net.Pipe()
	select {
	case l.conns <- srv:
		return cli, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "api.test:80" }

// windowAPI is an HTTP API that enforces q calls per fixed window of w
// seconds, windows aligned to the Unix epoch, and says so in the IETF
// RateLimit fields: RateLimit-Policy q=Q;w=W, and RateLimit r=R;t=T with T
// the whole seconds until the window ends, rounded up. Over the limit it
// answers 429 with Retry-After.
type windowAPI struct {
	q, w int64

	mu      sync.Mutex
	win     int64           // index of the current window
	n       int64           // calls counted in it
	ok      map[int64]int64 // admitted calls by window index
	rejects int64
}

func (a *windowAPI) ServeHTTP(rw http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if win := now.Unix() / a.w; win != a.win {
		a.win, a.n = win, 0
	}
	a.n++
	end := time.Unix((a.win+1)*a.w, 0)
	t := int64((end.Sub(now) + time.Second - 1) / time.Second)
	rw.Header().Set("RateLimit-Policy", fmt.Sprintf(`"api";q=%d;w=%d`, a.q, a.w))
	rw.Header().Set("RateLimit", fmt.Sprintf(`"api";r=%d;t=%d`, max(a.q-a.n, 0), t))
	if a.n > a.q {
		a.rejects++
		rw.Header().Set("Retry-After", fmt.Sprint(t))
		rw.WriteHeader(http.StatusTooManyRequests)
		return
	}
	a.ok[a.win]++
}

// serveWindowAPI starts a windowAPI behind an httptest.Server on a pipe
// listener, and returns it with an http.Client whose requests pass through
// the pacer and take latency each way.
func serveWindowAPI(t *testing.T, q, w int64, p *client.Pacer, latency time.Duration) (*windowAPI, *http.Client) {
	api := &windowAPI{q: q, w: w, win: -1, ok: map[int64]int64{}}
	lis := newPipeListener()
	srv := httptest.NewUnstartedServer(api)
	srv.Listener = lis
	srv.Start()
	base := &http.Transport{DialContext: lis.DialContext}
	t.Cleanup(func() {
		base.CloseIdleConnections()
		srv.Close()
	})
	slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		skew, _ := strconv.Atoi(r.Header.Get(workerHeader))
		time.Sleep(latency + time.Duration(skew)*time.Microsecond)
		resp, err := base.RoundTrip(r)
		time.Sleep(latency + time.Duration(skew)*time.Microsecond)
		return resp, err
	})
	return api, &http.Client{Transport: &client.Transport{Base: slow, Pacer: p}}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// hammer runs callers that each call url through c back to back until d
// passes (virtual time). Caller w's calls take w µs longer each way (see
// workerHeader).
func hammer(t *testing.T, c *http.Client, callers int, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
				req.Header.Set(workerHeader, strconv.Itoa(w))
				resp, err := c.Do(req)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("call: %v", err)
					}
					continue
				}
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// TestLocalUsesFixedWindowFromFields: an API enforcing 10 calls per 1-s
// fixed window, which it advertises in RateLimit-Policy and RateLimit, and
// ten callers calling it back to back through a Local pacer. Whatever the
// client was configured with, the API answers no 429, and every one of 15
// windows admits at least 9 calls (the quota less the default 10 %
// margin; a spent quota's hold ends with its window, so no window is lost
// to the one before): the first 15, or, when the client was configured
// below the published limit, the 15 after the first, which it spends at
// its configured rate until the first answer.
func TestLocalUsesFixedWindowFromFields(t *testing.T) {
	const q, windows, callers = 10, 15, 10
	for _, tc := range []struct {
		name        string
		rate, burst int64
	}{
		{"configured 10x too high", 100, 100},
		{"configured as published, burst 1", 10, 1},
		{"configured as published, full burst", 10, 10},
		{"configured too low", 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := client.New(client.Options{Limiter: client.NewLocal(tc.rate, time.Second, tc.burst, 0.1)})
				api, c := serveWindowAPI(t, q, 1, p, 2*time.Millisecond)
				first := time.Now().Unix()
				if tc.rate < q {
					first++
				}
				hammer(t, c, callers, time.Until(time.Unix(first+windows, 0)))
				api.mu.Lock()
				defer api.mu.Unlock()
				per := make([]int64, windows)
				low := false
				for i := range int64(windows) {
					per[i] = api.ok[first+i]
					low = low || per[i] < q-q/10
				}
				if api.rejects != 0 {
					t.Errorf("API answered %d × 429; want 0", api.rejects)
				}
				if low {
					t.Errorf("API admitted %v calls in its %d windows of %d; want ≥ %d in each (the quota less the 10 %% margin)", per, windows, q, q-q/10)
				}
			})
		})
	}
}
