package rlqs

import (
	"context"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// TestConcurrentStreamsNeverOverAssign: many Envoys join, report and leave
// on their own goroutines while rounds run on another; after a last round
// every remaining stream's assignment is a token bucket, and the rates the
// Envoys derive plus their full buckets fit the limit.
func TestConcurrentStreamsNeverOverAssign(t *testing.T) {
	const limit, streams = 100, 40 // the kindsConfig limit of api=search
	// Rounds advance the clock as fast as they run: no bucket is abandoned
	// or falls silent (two intervals without a report).
	r := newRig(t, kindsConfig, nil, func(o *Options) { o.AbandonAfter, o.Interval = 1000*time.Hour, 100*time.Hour })
	id := map[string]string{"api": "search"}

	stop := make(chan struct{})
	var rounds sync.WaitGroup
	rounds.Add(1)
	go func() {
		defer rounds.Done()
		for {
			select {
			case <-stop:
				return
			default:
				r.clock.Add(100 * time.Millisecond)
				r.srv.Round(context.Background())
			}
		}
	}()

	type envoy struct {
		c    *client
		last *rlqspb.RateLimitQuotaResponse
	}
	envoys := make([]*envoy, streams)
	var wg sync.WaitGroup
	for i := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := &envoy{c: r.open()}
			e.c.send("edge", usage(id, 0, 1, 0))
			e.last = e.c.recv()
			for k := range 5 {
				e.c.send("edge", usage(id, time.Second, uint64(10+i), uint64(k*i)))
			}
			envoys[i] = e
		}()
	}
	wg.Wait()
	close(stop)
	rounds.Wait()

	// Every stream has reported; a last round divides among all of them.
	waitFor(t, "reports processed", func() bool { return r.srv.reported.Load() >= streams*6 })
	r.clock.Add(time.Second)
	r.srv.Round(context.Background())
	// The division of the last round, as sent to each stream (what each
	// stream receives is checked by the other tests).
	var total float64
	r.srv.mu.Lock()
	n := 0
	for st := range r.srv.streams {
		for _, b := range st.buckets {
			n++
			tb := b.sent.GetTokenBucket()
			if tb == nil {
				t.Errorf("stream %s: %v, want a token bucket", st.id, b.sent)
				continue
			}
			total += float64(tb.GetMaxTokens()) + float64(tb.GetTokensPerFill().GetValue())/tb.GetFillInterval().AsDuration().Seconds()
		}
	}
	r.srv.mu.Unlock()
	if n != streams {
		t.Errorf("%d buckets after the last round, want %d", n, streams)
	}
	for i, e := range envoys {
		if e.last == nil {
			t.Errorf("envoy %d: no answer to its first report", i)
		}
	}
	// A stream with no share still refills one token a day (Envoy needs
	// tokens_per_fill > 0): at most streams/86400 per second above.
	if total > limit+streams/86400.0+1e-9 {
		t.Errorf("%d streams: full buckets + one second of the rates = %.6f > the limit %d", streams, total, limit)
	}
	if want := 0.9 * limit; total < want {
		t.Errorf("%d streams: full buckets + rates = %.1f, want at least %.0f (90 %% of the limit)", streams, total, want)
	}
	if got := r.srv.Streams(); got != streams {
		t.Errorf("Streams() = %d, want %d", got, streams)
	}
}

// TestBucketBeforeConfig: a bucket reported before the first config is
// allowed, and gets its token bucket as soon as a config arrives.
func TestBucketBeforeConfig(t *testing.T) {
	r := newRig(t, "", nil)
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "ALLOW_ALL" {
		t.Fatalf("before any config: %s, want ALLOW_ALL", got)
	}
	r.srv.SetPolicy(loadSet(t, kindsConfig))
	if got := blanketOf(checkTTL(t, action(t, c.recv(), id), 2*time.Second)); got != "token_bucket" {
		t.Fatalf("after the first config: %s, want token_bucket", got)
	}
}
