package client_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// startRatelimitd serves the real service (memory store) with
// testdata/pacing.yaml on an in-memory listener (bufconn), so that inside
// a synctest bubble every wait, the network's included, is on the
// bubble's clock.
func startRatelimitd(t *testing.T) *grpc.ClientConn {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	svc, err := service.New(service.Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	set, _, err := policy.Load(policy.LoadOptions{}, "testdata/pacing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	svc.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient("passthrough:///ratelimitd",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestRemoteSharesOneBudget: three Pacers (three programs) share one
// ratelimitd budget of 50 calls per second. 150 calls all go, none fails,
// and no second carries more than 50 of them, by ratelimitd's count. It
// runs in a synctest bubble: the seconds are the bubble's, however slow
// the machine.
func TestRemoteSharesOneBudget(t *testing.T) { synctest.Test(t, remoteSharesOneBudget) }

func remoteSharesOneBudget(t *testing.T) {
	cc := startRatelimitd(t)
	var mu sync.Mutex
	perSecond := map[int64]int{}
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		p := client.New(client.Options{Limiter: client.NewRemote(cc, "pacing", [][2]string{{"upstream", "payments-api"}})})
		for range 10 {
			wg.Go(func() {
				for range 5 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					err := p.Wait(ctx, 1)
					cancel()
					if err != nil {
						failed.Add(1)
						t.Errorf("Wait: %v", err)
						continue
					}
					now := time.Now().Unix()
					p.Done()
					mu.Lock()
					perSecond[now]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	total := 0
	for s, n := range perSecond {
		total += n
		// A call is counted in the second it was released, which can be the
		// second after ratelimitd admitted it: allow one window's spill.
		if n > 2*50 {
			t.Errorf("second %d released %d calls; ratelimitd admits 50 per second", s, n)
		}
	}
	if total != 150 || failed.Load() != 0 {
		t.Errorf("%d calls released, %d failed; want 150 and 0", total, failed.Load())
	}
	if len(perSecond) < 3 {
		t.Errorf("150 calls at 50 per second went within %d seconds; want at least 3 (callers must wait)", len(perSecond))
	}
}
