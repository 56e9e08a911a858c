// The sweeper: expired rows deleted in bounded batches.

package postgres

import (
	"context"
	"time"
)

// sweepSQL deletes at most $1 rows whose state expired (a key whose
// window ended is the same as a key never used), each batch its own short
// transaction. Rows a decision holds locked are skipped, so the sweeper
// never waits on a decision nor a decision long on the sweeper.
const sweepSQL = `DELETE FROM ratelimitd_counters WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ratelimitd_counters
	WHERE expires_us <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
	LIMIT $1 FOR UPDATE SKIP LOCKED))`

// sweepBatchTimeout bounds one batch's DELETE.
const sweepBatchTimeout = 10 * time.Second

// Sweep deletes every expired row, SweepBatch rows per statement, until a
// batch deletes fewer (or ctx ends), and returns how many it deleted.
// The sweeper calls it every SweepInterval.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for {
		bctx, cancel := context.WithTimeout(ctx, sweepBatchTimeout)
		tag, err := s.pool.Exec(bctx, sweepSQL, s.opts.SweepBatch)
		cancel()
		if err != nil {
			return total, classify(err, s.secrets)
		}
		n := tag.RowsAffected()
		total += n
		s.swept.Add(uint64(n))
		if n < int64(s.opts.SweepBatch) {
			return total, nil
		}
		select {
		case <-s.stop:
			return total, nil
		default:
		}
	}
}

func (s *Store) sweepLoop() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	for s.wait(s.opts.SweepInterval, nil) {
		if !s.ready.Load() || !s.breaker.Healthy() {
			continue
		}
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.sweepErrors.Add(1)
			s.log.Warn("durable store: sweeping expired rows failed; retried at the next sweep", "deleted", n, "err", err)
			continue
		}
		if n > 0 {
			s.log.Debug("durable store: expired rows deleted", "deleted", n)
		}
	}
}
