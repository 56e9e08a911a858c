package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcDriver is --client grpc: --concurrency goroutines, each making one
// blocking grpc-go call at a time over --conns shared ClientConns.
type grpcDriver struct {
	c     config
	ld    *load
	reqs  []*rlsv3.RateLimitRequest
	ccs   []*grpc.ClientConn
	quit  chan struct{}
	wg    sync.WaitGroup
	tally []tally
}

func newGRPCDriver(c config, ld *load, reqs []*rlsv3.RateLimitRequest) *grpcDriver {
	return &grpcDriver{c: c, ld: ld, reqs: reqs, quit: make(chan struct{}), tally: make([]tally, c.concurrency)}
}

func (g *grpcDriver) start(ctx context.Context) error {
	clients := make([]rlsv3.RateLimitServiceClient, g.c.conns)
	for i := range clients {
		cc, err := grpc.NewClient(g.c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		g.ccs = append(g.ccs, cc)
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	for w := 0; w < g.c.concurrency; w++ {
		g.wg.Add(1)
		go g.caller(ctx, w, clients[w%len(clients)])
	}
	return nil
}

func (g *grpcDriver) caller(ctx context.Context, w int, cl rlsv3.RateLimitServiceClient) {
	defer g.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	t := &g.tally[w]
	t.lat = make([]time.Duration, 0, 1<<16)
	for {
		select {
		case <-g.quit:
			return
		default:
		}
		k, ok := g.ld.next(rng)
		if !ok {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, g.c.timeout)
		t0 := time.Now()
		resp, err := cl.ShouldRateLimit(cctx, g.reqs[k])
		d := time.Since(t0)
		cancel()
		if g.ld.measuring.Load() {
			t.lat = append(t.lat, d)
			switch {
			case err != nil:
				t.errs++
			case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
				t.over++
			default:
				t.ok++
			}
		}
		g.ld.complete()
	}
}

// allFailed never fires: grpc-go reconnects, and its failed calls end
// as errors.
func (g *grpcDriver) allFailed() <-chan struct{} { return nil }

func (g *grpcDriver) stop() tally {
	close(g.quit)
	g.wg.Wait()
	for _, cc := range g.ccs {
		_ = cc.Close()
	}
	var all tally
	for _, t := range g.tally {
		all.add(t)
	}
	return all
}
