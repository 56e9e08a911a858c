package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

var evalshaStat = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+)`)

// evalshaUsec is INFO commandstats' EVALSHA calls and total µs.
func evalshaUsec(b *testing.B, c *goredis.Client) (calls, usec int64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	m := evalshaStat.FindStringSubmatch(info)
	if m == nil {
		return 0, 0
	}
	calls, _ = strconv.ParseInt(m[1], 10, 64)
	usec, _ = strconv.ParseInt(m[2], 10, 64)
	return calls, usec
}

// BenchmarkLuaSegment measures the Redis CPU time of take.lua per segment
// (INFO commandstats, EVALSHA usec / calls / segments: the script's own
// time on the server, without networking), reported as
// redis-µs/segment, for the previous script (v1, testdata/take_v1.lua)
// and the current one in alternation, per kind, for invocations of 1 and
// 16 segments of 1 or 2 hits (allowed takes of cost 1 on random keys of a
// 10,000-key pool, the server's TIME). Compare v1 and current within one
// run, since the machine's load moves both.
//
//	go test ./pkg/backend/redis/ -run '^$' -bench LuaSegment -benchtime 3000x
func BenchmarkLuaSegment(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client()
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	scripts := []struct {
		name string
		s    *goredis.Script
	}{{"v1", goredis.NewScript(takeLuaV1)}, {"current", goredis.NewScript(takeLuaNew)}}
	for _, sc := range scripts {
		if err := sc.s.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
	}
	limits := []algo.Limit{
		{Kind: algo.FixedWindow, Rate: 1_000_000, Period: time.Minute},
		{Kind: algo.SlidingWindow, Rate: 1_000_000, Period: time.Minute},
		{Kind: algo.TokenBucket, Rate: 1_000_000, Period: time.Minute},
		{Kind: algo.SlidingLog, Rate: 1_000_000, Period: time.Second},
	}
	shapes := []struct{ segs, hits int }{{1, 1}, {16, 1}, {16, 2}}
	for _, l := range limits {
		for _, sh := range shapes {
			for _, sc := range scripts {
				name := fmt.Sprintf("%s/segs=%d/hits=%d/%s", kindName(l), sh.segs, sh.hits, sc.name)
				b.Run(name, func(b *testing.B) {
					rng := rand.New(rand.NewPCG(1, 2))
					keys := make([]string, 0, sh.segs*sh.hits)
					args := make([]any, 0, 1+sh.segs*(4+8*sh.hits))
					c.ConfigResetStat(ctx)
					calls0, usec0 := evalshaUsec(b, c)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						keys, args = keys[:0], append(args[:0], sh.segs)
						for s := range sh.segs {
							args = append(args, "t", "", strconv.Itoa(i*sh.segs+s), sh.hits)
							for h := range sh.hits {
								keys = append(keys, fmt.Sprintf("bench:%s:%d:%d", sc.name, h, rng.IntN(10_000)))
								args = append(args, int(l.Kind), l.Rate, l.Period.Microseconds(), 0, 0, 1, 1, 0)
							}
						}
						if err := sc.s.EvalSha(ctx, c, keys, args...).Err(); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					calls, usec := evalshaUsec(b, c)
					if calls -= calls0; calls > 0 {
						b.ReportMetric(float64(usec-usec0)/float64(calls)/float64(sh.segs), "redis-µs/segment")
					}
				})
			}
		}
	}
}
