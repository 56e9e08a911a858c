package rlqs

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// BenchmarkFirstAnswer measures, over loopback gRPC, the time from a new
// bucket's first report to its assignment (Envoy applies its no-assignment
// behaviour meanwhile; the bound is 50 ms). Each iteration is a new bucket
// on one stream; on Redis the new demand is shared first (one script).
func BenchmarkFirstAnswer(b *testing.B) {
	run := func(b *testing.B, r *rig) {
		c := r.open()
		b.ResetTimer()
		lat := make([]time.Duration, 0, b.N)
		for i := range b.N {
			id := map[string]string{"tenant": "t" + strconv.Itoa(i), "user": "u"}
			start := time.Now()
			c.send("edge", usage(id, 0, 1, 0))
			c.recv()
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
		b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	}
	b.Run("memory", func(b *testing.B) { run(b, newRig(b, kindsConfig, nil)) })
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Standalone(b)
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		st, err := redis.New(o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		run(b, newRig(b, kindsConfig, st, func(o *Options) { o.Demand = st }))
	})
}
