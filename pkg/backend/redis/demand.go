package redis

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// demandLua records the demand of one replica's streams on a counter for a
// round and returns the demand of every stream in that round and the two
// before. KEYS[1]: this round's hash, KEYS[2], KEYS[3]: the two rounds
// before (same hash slot); ARGV[1]: TTL in ms; ARGV[2..]: stream id,
// demand pairs.
const demandLua = `
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i+1])
end
if #ARGV > 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[2])}
`

var demandScript = goredis.NewScript(demandLua)

// demandKey is the key of the shared demand on key in round: in key's hash
// slot ("{key}" tags it unless it has a hash tag already).
func demandKey(key string, round int64) string {
	var b strings.Builder
	if i := strings.IndexByte(key, '{'); i >= 0 && strings.IndexByte(key[i+1:], '}') > 0 {
		b.WriteString(key)
	} else {
		b.WriteByte('{')
		b.WriteString(key)
		b.WriteByte('}')
	}
	b.WriteString(":rlqs:")
	b.WriteString(strconv.FormatInt(round, 10))
	return b.String()
}

// ShareDemand shares the demand of RLQS streams on counters among the
// replicas (rlqs.Demand): per counter key, one script records local
// (stream id -> demand) in a hash per round that expires after ttl, and
// returns per stream its demand of the previous round, else the one
// before, else this round's, so every replica dividing in a round sees the
// same numbers. All keys' scripts go in one pipeline under the circuit
// breaker, bounded by ctx only: it is background work whose budget the
// caller sets, not a request's decision. No key's view is returned when
// one failed; a call cut short by ctx fails with ErrDeadline or its
// cancellation, which the breaker does not count.
func (s *Store) ShareDemand(ctx context.Context, round int64, ttl time.Duration, local map[string]map[string]int64) (map[string]map[string]int64, error) {
	out := make(map[string]map[string]int64, len(local))
	if len(local) == 0 {
		return out, nil
	}
	names := make([]string, 0, len(local))
	for k := range local {
		names = append(names, k)
	}
	sort.Strings(names)
	type call struct {
		keys []string
		args []any
		cmd  *goredis.Cmd
	}
	calls := make([]*call, len(names))
	for i, k := range names {
		args := make([]any, 0, 1+2*len(local[k]))
		args = append(args, max(ttl.Milliseconds(), 1))
		for id, d := range local[k] {
			args = append(args, id, d)
		}
		calls[i] = &call{keys: []string{demandKey(k, round), demandKey(k, round-1), demandKey(k, round-2)}, args: args}
	}
	caller := ctx
	err := s.masterFor(ctx, calls[0].keys[0]).breaker.Do(ctx, 0, func(ctx context.Context) error {
		pending := calls
		for attempt := 0; attempt < 2 && len(pending) > 0; attempt++ {
			_, _ = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for _, c := range pending {
					if attempt == 0 {
						c.cmd = p.EvalSha(ctx, demandScript.Hash(), c.keys, c.args...)
					} else {
						c.cmd = p.Eval(ctx, demandLua, c.keys, c.args...)
					}
				}
				return nil
			})
			var again []*call
			for _, c := range pending {
				if err := c.cmd.Err(); err != nil {
					if !goredis.HasErrorPrefix(err, "NOSCRIPT") {
						return callerCut(caller, err)
					}
					again = append(again, c)
				}
			}
			pending = again
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, k := range names {
		view := map[string]int64{}
		parts, _ := calls[i].cmd.Val().([]any)
		for _, p := range parts { // this round, two before, the previous: the last wins
			kv, _ := p.([]any)
			for j := 0; j+1 < len(kv); j += 2 {
				id, _ := kv[j].(string)
				v, _ := kv[j+1].(string)
				if d, err := strconv.ParseInt(v, 10, 64); err == nil && id != "" {
					view[id] = d
				}
			}
		}
		out[k] = view
	}
	return out, nil
}

// callerCut is err, or when caller's deadline has passed or caller is
// canceled (they cut the call, not Options.Timeout) ErrDeadline or the
// cancellation. The deadline is read from the clock: go-redis' read
// deadline can fire before caller's Err is set.
func callerCut(caller context.Context, err error) error {
	if d, ok := caller.Deadline(); ok && !time.Now().Before(d) {
		return ErrDeadline
	}
	if caller.Err() != nil {
		return caller.Err()
	}
	return err
}
