package redis

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// WaitRefunds waits for the compensating refunds (and other background
// segments) the Store has started: tests read counters once they ran.
func (s *Store) WaitRefunds() { s.bg.Wait() }

// SetServerOffset sets the Store's estimate of the server's clock to the
// local clock plus us (window keys), not yet verified: tests make it
// wrong on purpose.
func (s *Store) SetServerOffset(us int64) {
	for _, m := range s.paths() {
		m.clock.set(time.Now().UnixMicro() + us)
	}
}

// Ping sends PING on one of the Store's own connections: tests make Redis
// answer something at a chosen moment.
func (s *Store) Ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }

// PoolStats is the go-redis pool's counters: tests count the connections
// taken from the pool (Hits + Misses).
func (s *Store) PoolStats() *goredis.PoolStats { return s.client.PoolStats() }

// SweeperTicks is how many times the default master's sweeper has ticked.
func (s *Store) SweeperTicks() int64 { return s.batch.sweeps.Load() }

// AddClientHook adds h to the Store's go-redis client: tests delay its
// commands at a chosen moment.
func (s *Store) AddClientHook(h goredis.Hook) { s.client.AddHook(h) }

// Window1Function and Window1Lib are the names of the function the Store
// calls for lone window decisions and of the library it loads it in.
var Window1Function, Window1Lib = window1Func, window1Lib
