package refdiff

import (
	"context"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// countingScenarios hit counters after denials and deny requests with
// several counted descriptors: their answers depend on how the hits of a
// denied request are counted. The reference charges every hit of every
// request; reference mode does too (--counting=always_charge).
func countingScenarios() []scenario {
	return []scenario{
		{name: "two keys, the hour limit trips first", limited: true, reachesOver: true, steps: func() []step {
			v := unique("k")
			// The reference's integration scenario: key2 20/min and key3
			// 10/h in one request, 15 times: key3 denies from the 11th,
			// and key2 goes on counting (or, with
			// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, stays at 10 left).
			return repeat(15, "key2 and key3", func() *rlsv3.RateLimitRequest {
				return req("another", d("key2", v), d("key3", v))
			})
		}()},
		{name: "hits_addend over the limit, then fewer", limited: true, reachesOver: true, steps: func() []step {
			v := unique("o")
			return steps(
				one("18 hits", reqHits(18, "another", d("key4", v))),
				one("5 hits: over", reqHits(5, "another", d("key4", v))),
				one("2 hits", reqHits(2, "another", d("key4", v))),
				one("1 hit", req("another", d("key4", v))),
			)
		}()},
		{name: "a zero limit next to a counted one", limited: true, reachesOver: true, steps: func() []step {
			u := unique("b")
			return repeat(4, "block and daily", func() *rlsv3.RateLimitRequest {
				return req("refdiff", d("block", u), d("daily", u))
			})
		}()},
		{name: "shadow limit over, next to a counted one", limited: true, steps: func() []step {
			u := unique("s")
			return repeat(4, "shadow and acme user", func() *rlsv3.RateLimitRequest {
				return req("refdiff", d("shadow", u), d("org", "acme", "user", u))
			})
		}()},
	}
}

// TestDifferentialCounting: the reference's default counting
// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset), headers on.
//
// Reference mode counts these fixed windows as the reference does, by
// INCRBY and PEXPIRE with no script (docs/redis.md, "Native counting"):
// the shared redis-server (its slow log set to record every command) ran
// no EVALSHA or EVAL for the scenarios' requests; the Store's health
// probe, which writes its own probe key in idle gaps, may.
func TestDifferentialCounting(t *testing.T) {
	p := startPair(t, []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"}, map[string]string{"refdiff.yaml": refdiffConfig})
	ctx := context.Background()
	c := p.redis.Client()
	for _, kv := range [][2]string{{"slowlog-max-len", "100000"}, {"slowlog-log-slower-than", "0"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, sc := range countingScenarios() {
		t.Run(sc.name, func(t *testing.T) { p.run(t, sc) })
	}
	logs, err := c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	incr := 0
	for _, l := range logs {
		if len(l.Args) == 0 {
			continue
		}
		switch strings.ToLower(l.Args[0]) {
		case "incrby":
			incr++
		case "evalsha", "eval":
			if !slices.ContainsFunc(l.Args, func(a string) bool { return strings.Contains(a, "health-probe") }) {
				t.Errorf("reference mode ran a script for a request: %q", l.Args)
			}
		}
	}
	if incr == 0 {
		t.Errorf("no INCRBY in the slow log of %d commands", len(logs))
	}
}
