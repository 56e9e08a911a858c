package postgres_test

import (
	"crypto/rand"
	"encoding/base64"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// BenchmarkRowSize writes b.N keys of the default form (the key prefix
// and a 22-character hash) once each, in requests of 100 hits, and
// reports the table's size with its indexes (pg_total_relation_size) per
// key, after the inserts and again after every key was updated once more
// and VACUUM ran:
//
//	go test -run '^$' -bench BenchmarkRowSize -benchtime 100000x ./pkg/backend/postgres/
func BenchmarkRowSize(b *testing.B) {
	srv := pgtest.Start(b)
	db := srv.CreateDB(b)
	s := newStore(b, srv, db, func(o *postgres.Options) { o.SweepInterval = 0 })
	day := algo.Limit{Kind: algo.FixedWindow, Rate: 1000, Period: 24 * time.Hour}
	keys := make([]string, b.N)
	for i := range keys {
		r := make([]byte, 16)
		_, _ = rand.Read(r)
		keys[i] = "ratelimitd:" + base64.RawURLEncoding.EncodeToString(r)
	}
	round := func() {
		for i := 0; i < len(keys); i += 100 {
			hits := make([]algo.Hit, 0, 100)
			for _, k := range keys[i:min(i+100, len(keys))] {
				hits = append(hits, algo.Hit{Key: k, Limit: day, Cost: 1})
			}
			take(b, s, hits...)
		}
	}
	b.ResetTimer()
	round()
	b.StopTimer()
	size := func() float64 {
		return float64(srv.QueryInt(b, db, "SELECT pg_total_relation_size('ratelimitd_counters')")) / float64(b.N)
	}
	b.ReportMetric(size(), "bytes/key")
	round()
	srv.Exec(b, db, "VACUUM ratelimitd_counters")
	b.ReportMetric(size(), "bytes/key-updated")
	if n := srv.QueryInt(b, db, "SELECT count(*) FROM ratelimitd_counters"); n != int64(b.N) {
		b.Fatalf("%d rows for %d keys", n, b.N)
	}
}
