package redis

import (
	"context"
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

// ShareDemand shares the demand of RLQS streams on a counter among the
// replicas (rlqs.Demand): one script records local (stream id -> demand)
// in a hash per round that expires after ttl, and returns per stream its
// demand of the previous round, else of the one before, else of this round
// (every replica dividing in a round sees the same numbers). The
// stream ids and the counter key carry no request value. It runs under the
// circuit breaker and Options.Timeout; errors are classified.
func (s *Store) ShareDemand(ctx context.Context, key string, round int64, ttl time.Duration, local map[string]int64) (map[string]int64, error) {
	keys := []string{demandKey(key, round), demandKey(key, round-1), demandKey(key, round-2)}
	args := make([]any, 0, 1+2*len(local))
	args = append(args, max(ttl.Milliseconds(), 1))
	for id, d := range local {
		args = append(args, id, d)
	}
	var reply any
	err := s.masterFor(ctx, keys[0]).breaker.Do(ctx, s.timeout, func(ctx context.Context) error {
		var err error
		reply, err = demandScript.Run(ctx, s.client, keys, args...).Result()
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	parts, _ := reply.([]any)
	for _, p := range parts { // this round, two before, the previous: the last wins
		kv, _ := p.([]any)
		for i := 0; i+1 < len(kv); i += 2 {
			id, _ := kv[i].(string)
			v, _ := kv[i+1].(string)
			if d, err := strconv.ParseInt(v, 10, 64); err == nil && id != "" {
				out[id] = d
			}
		}
	}
	return out, nil
}
