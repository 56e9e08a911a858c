package rlqs

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// TestSilentStreamsHoldNoShare: 20 streams each report one request with
// time_elapsed 0 and then nothing (Envoys that died, or clients holding
// streams open), next to 2 real Envoys with demand 100/s each on a limit of
// 50/s. A bucket's demand follows its reports: one not reported for two
// intervals has no demand, so from the fifth second on (two intervals of silence, then
// the fleet's view of one round before) the real Envoys
// admit at least 90 % of the limit, long before --rlqs-abandon-after.
func TestSilentStreamsHoldNoShare(t *testing.T) {
	const limit, silent = 50, 20
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	store, err := memory.New(memory.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	set := loadFleetPolicy(t, limit)
	srv := newReplica(t, store, NewMemory(), clock, "a", set)
	for i := 0; i < silent; i++ {
		e := &simEnvoy{t: t, clock: clock, domain: "edge", id: map[string]string{"api": "search"}}
		e.connect(srv)
		t.Cleanup(e.stream.cancel)
		e.b = &simBucket{id: e.id}
		e.admit(clock.Now(), 1)
		e.report(clock.Now(), true)
	}
	f := &fleetRun{limit: limit, demand: []float64{100, 100}, duration: 10 * time.Second, replicas: []*Server{srv}}
	res := f.run(t, clock)
	t.Logf("admitted per second: %v; rates %v", res.admitted, res.rates)
	for s := 4; s < len(res.admitted); s++ {
		if got := res.admitted[s]; got < limit*9/10 || got > limit+limit/10 {
			t.Errorf("second %d: the real Envoys admitted %d, want %d..%d", s, got, limit*9/10, limit+limit/10)
		}
	}
	if srv.opt.AbandonAfter <= f.duration {
		t.Fatalf("the run must end before the silent buckets are abandoned (%s)", srv.opt.AbandonAfter)
	}
}
