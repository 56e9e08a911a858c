package e2e

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

const leasedFile = `domain: e2e
descriptors:
  - key: hot
    rate_limit:
      unit: second
      requests_per_unit: 500
      consistency: leased
`

// TestLeasedAcrossProcesses: three ratelimitd processes on one
// redis-server decide a leased limit of 500 per second under demand far
// above it, and one is killed (SIGKILL) while it holds units. No window
// admits more than 500 across the processes (a call spanning a window
// boundary counts at the boundary, nor two adjacent windows more than
// 1000), no window's counter in Redis exceeds 500, and the median of the
// 8 windows before the kill admits at least 95 % of the limit: a window
// in which a starved host stalls a process's renewals or workers loses
// the units that process holds when it ends (the price of leasing), but
// such stalls do not take most windows.
func TestLeasedAcrossProcesses(t *testing.T) {
	const steadyWindows = 8
	redistest.Require(t)
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeFile(t, dir, "e2e.yaml", leasedFile)
	var procs []*proc
	var conns []*grpc.ClientConn
	for range 3 {
		p := start(t, startOpts{args: []string{"--config", dir, "--backend=redis", "--redis-url", srv.URL(), "--log-level=info"}})
		cc := p.dial(t)
		p.waitServing(t, cc, "")
		procs, conns = append(procs, p), append(conns, cc)
	}
	// A window that began before the server did grants no lease (its
	// start is known to the second).
	time.Sleep(1200 * time.Millisecond)

	const p = int64(time.Second / time.Microsecond)
	stop := make(chan struct{})
	var mu sync.Mutex
	admitted := map[int64]int64{} // by window start
	boundary := map[int64]int64{} // by the boundary the call spanned
	var errs atomic.Int64
	var granted atomic.Int64 // the largest window counter seen in Redis
	var sampled atomic.Int64 // window counters read
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			// The window counters: "{<key>}:v2:<window start>" (window
			// keys, the default layout).
			keys, err := srv.Client().Keys(context.Background(), "*}:v2:*").Result()
			if err != nil {
				continue
			}
			for _, k := range keys {
				v, err := srv.Client().Get(context.Background(), k).Int64()
				if err != nil {
					continue
				}
				sampled.Add(1)
				if v > granted.Load() {
					granted.Store(v)
				}
			}
		}
	}()
	var alive [3]atomic.Bool
	var wg sync.WaitGroup
	for i, cc := range conns {
		alive[i].Store(true)
		client := rlsv3.NewRateLimitServiceClient(cc)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("hot", "x")}}
				for {
					select {
					case <-stop:
						return
					default:
					}
					if !alive[i].Load() {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					tb := time.Now()
					resp, err := client.ShouldRateLimit(ctx, r)
					ta := time.Now()
					cancel()
					if err != nil {
						errs.Add(1)
						continue
					}
					if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						continue
					}
					b, a := tb.UnixMicro(), ta.UnixMicro()
					mu.Lock()
					if b-b%p == a-a%p {
						admitted[a-a%p]++
					} else {
						boundary[a-a%p]++
					}
					mu.Unlock()
				}
			}()
		}
	}
	now := time.Now().UnixMicro()
	from := now - now%p + p
	time.Sleep(time.Duration((steadyWindows+1)*p) * time.Microsecond) // at least steadyWindows whole windows
	now = time.Now().UnixMicro()
	to := now - now%p
	// Kill the third process while it holds units: they are never
	// returned.
	alive[2].Store(false)
	_ = procs[2].Cmd.Process.Kill()
	<-procs[2].Done()
	procs[2].stopOnce.Do(func() {})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	<-sampling

	mu.Lock()
	defer mu.Unlock()
	var steady []int64
	for ws := from; ws < to; ws += p {
		steady = append(steady, admitted[ws]+boundary[ws])
	}
	for ws, c := range admitted {
		if c > 500 {
			t.Errorf("window %d admitted %d across the processes > limit 500", ws, c)
		}
		if c2 := admitted[ws+p]; c+c2+boundary[ws+p] > 1000 {
			t.Errorf("windows %d and the next admitted %d + %d, and %d calls across their boundary: > 1000", ws, c, c2, boundary[ws+p])
		}
	}
	t.Logf("admitted per window: %v, at boundaries: %v (steady windows %d..%d); largest Redis window counter %d (of %d read); calls failed: %d",
		admitted, boundary, from, to, granted.Load(), sampled.Load(), errs.Load())
	if g := granted.Load(); g > 500 {
		t.Errorf("a window counter in Redis reached %d > 500", g)
	}
	if sampled.Load() == 0 {
		t.Error("no window counter found in Redis: the check above saw nothing")
	}
	slices.Sort(steady)
	if len(steady) < steadyWindows {
		t.Errorf("%d steady windows, want %d", len(steady), steadyWindows)
	} else if med := steady[len(steady)/2]; med < 500*95/100 {
		t.Errorf("steady windows admitted %v (sorted): the median %d is below 95 %% of 500", steady, med)
	}
}
