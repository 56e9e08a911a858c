package rlqs

import (
	"context"
	"testing"
)

// TestFirstPeriodicReportIsDemand: Envoy's first periodic report of a new
// bucket comes less than a second after its first report, so its
// time_elapsed reads 0. Its 50 requests are a demand of at least 50 per
// second: the next round assigns that, not the floor of a tenth of the
// limit (100 per second) that a bucket of unknown demand gets.
func TestFirstPeriodicReportIsDemand(t *testing.T) {
	r := newRig(t, kindsConfig, nil)
	c := r.open()
	id := map[string]string{"api": "search"}
	c.send("edge", usage(id, 0, 1, 0))
	c.recv()
	c.send("edge", usage(id, 0, 30, 20))
	waitFor(t, "reports processed", func() bool { return r.srv.reported.Load() == 2 })
	r.srv.Round(context.Background())
	tb := checkTTL(t, action(t, c.recv(), id), r.srv.TTL()).GetTokenBucket()
	if tb == nil {
		t.Fatal("want a token bucket")
	}
	rate := float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
	if rate < 45 {
		t.Errorf("assigned %.1f per second, want the demand of 50 (at least 45), not the floor of 10", rate)
	}
}
