// Take: one request's hits decided by one call of ratelimitd_take within
// the call's budget.

package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// takeSQL calls the schema's function (schema_v1.sql) with every hit of a
// request; pgx prepares it once per connection.
const takeSQL = `SELECT now_us, mode, st_win, st_cnt, st_prv, allowed
FROM ratelimitd_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// Flags of a hit in ratelimitd_take's p_flags.
const (
	flagRelease = 1
	flagCharge  = 2
	flagSoft    = 4
)

// budget is when a call started at start must return: start + Timeout,
// or earlier the caller's deadline less min(DeadlineMargin, a quarter of
// the time left). cut reports that the caller's deadline set it.
func (s *Store) budget(ctx context.Context, start time.Time) (end time.Time, cut bool) {
	end = start.Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok {
		d = d.Add(-min(s.opts.DeadlineMargin, d.Sub(start)/4))
		if d.Before(end) {
			return d, true
		}
	}
	return end, false
}

// Take decides the hits of one request into out (service.Store), each a
// fixed_window or sliding_window limit, in one call of ratelimitd_take:
// one statement that locks the request's rows in key order, reads the
// server's clock, decides all-or-nothing as algo.Apply does and writes the
// rows that changed. Concurrent requests of the process on the same keys
// are sent together in one transaction (see decide). Take returns by its
// budget with cause CauseTimeout when PostgreSQL has not answered
// (errors.Is context.DeadlineExceeded when the caller's deadline cut the
// budget short), and a decision answered with an error is not counted:
// its transaction is not committed, or reconciled and refunded when the
// COMMIT's reply did not come (see send). It fails at once while the breaker
// is open, and with ErrNotConnected until New has reached PostgreSQL and
// checked the schema. Errors are *Error.
func (s *Store) Take(ctx context.Context, hits []algo.Hit, out []algo.Decision) error {
	if len(hits) == 0 {
		return nil
	}
	for _, h := range hits {
		if h.Limit.Kind != algo.FixedWindow && h.Limit.Kind != algo.SlidingWindow {
			return newError(CauseUnsupported, false, fmt.Errorf("algorithm %d: only fixed_window and sliding_window are supported", h.Limit.Kind))
		}
	}
	if !s.ready.Load() {
		return s.notReady.Load()
	}
	start := time.Now()
	end, cut := s.budget(ctx, start)
	if !end.After(start) {
		return errBudgetCut
	}
	at := s.clk.Now() // the breaker's time of the call
	if err := s.breaker.Allow(at); err != nil {
		return err
	}
	cctx, cancel := context.WithDeadline(ctx, end)
	err := s.decide(cctx, hits, out, end)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = classify(ctx.Err(), s.secrets)
		case errors.Is(err, errQueued):
		case cctx.Err() != nil:
			err = errTimeout
		}
	}
	cancel()
	rec := err
	switch {
	case errors.Is(err, errTimeout) && cut, errors.Is(err, context.DeadlineExceeded):
		rec = errBudgetCut
	case errors.Is(err, errTimeout) && time.Now().Before(end):
		// The batch ran out of the budget of another of its calls,
		// cut by that caller's deadline, before this one's: no whole
		// Timeout of silence either.
		rec = errBudgetCut
	}
	if err == nil {
		s.answered.Store(time.Now().UnixNano())
	}
	s.breaker.RecordSince(at, s.clk.Now(), rec)
	s.note(rec)
	if errors.Is(err, errTimeout) && cut || errors.Is(err, context.DeadlineExceeded) {
		return errBudgetCut
	}
	return err
}

// args returns the distinct keys of hits, sorted (the order the function
// locks them in), and takeSQL's arguments for them.
func (s *Store) args(hits []algo.Hit) (keys []string, args []any) {
	n := len(hits)
	keys = make([]string, 0, n)
	for _, h := range hits {
		keys = append(keys, h.Key)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	slot := make([]int32, n)
	kind := make([]int32, n)
	rate := make([]int64, n)
	period := make([]int64, n)
	cal := make([]int32, n)
	mult := make([]int64, n)
	cost := make([]int64, n)
	flags := make([]int32, n)
	for i, h := range hits {
		k, _ := slices.BinarySearch(keys, h.Key)
		slot[i] = int32(k + 1)
		kind[i] = int32(h.Limit.Kind)
		rate[i] = h.Limit.Rate
		period[i] = max(h.Limit.Period.Microseconds(), 1)
		cal[i] = int32(h.Limit.Calendar)
		mult[i] = h.Limit.Multiplier
		cost[i] = algo.ClampCost(h.Cost)
		var f int32
		if h.Release {
			f |= flagRelease
		}
		if h.Charge {
			f |= flagCharge
		}
		if h.Soft {
			f |= flagSoft
		}
		flags[i] = f
	}
	var now *int64
	if s.now != nil {
		us := s.now().UnixMicro()
		now = &us
	}
	return keys, []any{now, keys, slot, kind, rate, period, cal, mult, cost, flags}
}

// takeRow is one row of takeSQL.
type takeRow struct {
	nowUs               int64
	mode                []int32
	stWin, stCnt, stPrv []int64
	allowed             []bool
}

// decode writes the decisions of hits from r into out.
func decode(hits []algo.Hit, r *takeRow, out []algo.Decision) error {
	n := len(hits)
	if len(r.mode) != n || len(r.stWin) != n || len(r.stCnt) != n || len(r.stPrv) != n || len(r.allowed) != n {
		return newError(CauseOther, false, fmt.Errorf("ratelimitd_take returned %d decisions for %d hits", len(r.mode), n))
	}
	t := time.UnixMicro(r.nowUs)
	for i, h := range hits {
		st := algo.State{Time: r.stWin[i], Count: r.stCnt[i], Prev: r.stPrv[i]}
		var d algo.Decision
		if r.mode[i] == 1 {
			_, d = algo.Take(h.Limit, st, t, 0)
		} else {
			_, d = algo.Apply(st, h, t)
			if d.Allowed != r.allowed[i] {
				// The function and pkg/algo disagree: a defect, never
				// answered as a decision.
				return newError(CauseOther, false, fmt.Errorf("hit %d: the database decided allowed=%v, pkg/algo %v", i, r.allowed[i], d.Allowed))
			}
		}
		out[i] = d
	}
	return nil
}
