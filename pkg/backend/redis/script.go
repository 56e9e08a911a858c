package redis

import (
	_ "embed"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// takeLua is the one script that decides the hits of a request. It is
// embedded from take.lua and called with EVALSHA; a call answered NOSCRIPT
// (first call on a server, SCRIPT FLUSH, restart, failover) is sent again
// as EVAL, which caches it again (batcher.exec).
//
//go:embed take.lua
var takeLua string

// takeScript is the shared script handle; its SHA1 (EVALSHA's argument) is
// computed once.
var takeScript = goredis.NewScript(takeLua)

// Script modes (ARGV[1]).
const (
	modeTake   = "t"
	modeRefund = "r"
)

// fieldsPerHit is the number of ARGV entries per hit after the 3 header
// fields; it must match NF in take.lua.
const fieldsPerHit = 8

// replyPerHit is the number of integers per hit in the reply after now_us.
const replyPerHit = 5

// scriptArgs encodes the ARGV of one script call: mode, now_us ("" for the
// server's TIME), nonce, then per hit kind, rate, period_us, burst,
// calendar, multiplier, cost, flags (1 release, 2 soft).
func scriptArgs(mode string, nowUS int64, nonce string, hits []algo.Hit) []any {
	args := make([]any, 0, 3+fieldsPerHit*len(hits))
	now := ""
	if nowUS >= 0 {
		now = strconv.FormatInt(nowUS, 10)
	}
	args = append(args, mode, now, nonce)
	for _, h := range hits {
		l := h.Limit
		flags := 0 // take.lua: 1 release, 2 soft
		if h.Release {
			flags |= 1
		}
		if h.Soft {
			flags |= 2
		}
		mult := l.Multiplier
		if mult < 1 {
			mult = 1
		}
		args = append(args,
			int64(l.Kind), l.Rate, l.Period.Microseconds(), l.Burst,
			int64(l.Calendar), mult, h.Cost, flags)
	}
	return args
}

func hitKeys(hits []algo.Hit) []string {
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
	}
	return keys
}

// parseReply decodes the script's reply into decisions (written into out,
// len(out) == number of hits) and returns the script's now in microseconds.
func parseReply(v any, out []algo.Decision) (int64, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 1+replyPerHit*len(out) {
		return 0, fmt.Errorf("redis: unexpected script reply %T of length %d for %d hits", v, lenOf(v), len(out))
	}
	ints := make([]int64, len(arr))
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return 0, fmt.Errorf("redis: unexpected script reply element %d: %T", i, x)
		}
		ints[i] = n
	}
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	for i := range out {
		r := ints[1+i*replyPerHit:]
		out[i] = algo.Decision{
			Allowed:     r[0] == 1,
			Remaining:   r[1],
			RetryAfter:  us(r[2]),
			ResetAfter:  us(r[3]),
			WindowAfter: us(r[4]),
		}
	}
	return ints[0], nil
}

func lenOf(v any) int {
	if a, ok := v.([]any); ok {
		return len(a)
	}
	return -1
}
