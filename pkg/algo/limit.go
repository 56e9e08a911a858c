// The bounds every algorithm and its Redis port assume, and their check.

package algo

import (
	"errors"
	"fmt"
	"time"
)

// MaxExact is 2^53, the bound below which every integer is exact in an IEEE
// double (a Lua 5.1 number in the Redis script). Limit.Validate keeps every
// integer the algorithms store or multiply below it.
const MaxExact = int64(1) << 53

// MaxCost is the largest cost the algorithms (and the Redis script) take.
// Every capacity is below it, so a take of MaxCost is always denied and
// writes nothing. Callers clamp hits_addend (up to 2^64-1) to it so that
// every store sees the same cost.
const MaxCost = MaxExact

// ClampCost returns cost within [0, MaxCost]: negative costs count as 0,
// costs above MaxCost as MaxCost.
func ClampCost(cost int64) int64 { return min(max(cost, 0), MaxCost) }

// MaxSlidingLogRate bounds Rate for SlidingLog limits: the log holds up to
// Rate timestamps per key (8 bytes each in memory, a sorted-set member in
// Redis). Higher rates should use SlidingWindow.
const MaxSlidingLogRate = 10_000

// MaxConcurrencyRate bounds Rate for Concurrency limits (one timestamp per
// live lease is stored).
const MaxConcurrencyRate = 100_000

// MaxPeriod bounds Period (and, with a calendar, the window length): 100
// years, far below 2^53 µs, so that instants plus periods stay exact.
const MaxPeriod = 100 * 366 * 24 * time.Hour

// ErrInvalidLimit is wrapped by every Limit.Validate error.
var ErrInvalidLimit = errors.New("algo: invalid limit")

// Validate reports whether l respects the bounds every algorithm (and its
// Redis port) assumes, so that every stored integer stays exact in a Lua
// double. The config loader calls it and shows the message. The bounds:
// Period a whole number of microseconds up to MaxPeriod, calendar windows
// only for fixed and sliding windows, the log kinds' Rate caps, and a
// token bucket's capacity × Period(µs) and capacity × Rate at most 2^53.
func (l Limit) Validate() error {
	if l.Kind > Concurrency {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, l.Kind)
	}
	if l.Rate < 0 {
		return fmt.Errorf("%w: requests_per_unit %d is negative", ErrInvalidLimit, l.Rate)
	}
	if l.Period < time.Microsecond || l.Period > MaxPeriod {
		return fmt.Errorf("%w: period %v outside [1µs, %v]", ErrInvalidLimit, l.Period, MaxPeriod)
	}
	if l.Period%time.Microsecond != 0 {
		return fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrInvalidLimit, l.Period)
	}
	if l.Burst < 0 {
		return fmt.Errorf("%w: burst %d is negative", ErrInvalidLimit, l.Burst)
	}
	if l.Calendar != CalendarNone {
		if l.Kind != FixedWindow && l.Kind != SlidingWindow {
			return fmt.Errorf("%w: calendar windows apply to fixed_window and sliding_window only", ErrInvalidLimit)
		}
		if l.Calendar > CalendarYear {
			return fmt.Errorf("%w: unknown calendar %d", ErrInvalidLimit, l.Calendar)
		}
		maxMult := int64(1200) // 100 years of months, as MaxPeriod
		if l.Calendar == CalendarYear {
			maxMult = 100
		}
		if l.Multiplier < 1 || l.Multiplier > maxMult {
			return fmt.Errorf("%w: calendar unit_multiplier %d outside [1, %d]", ErrInvalidLimit, l.Multiplier, maxMult)
		}
	}
	switch l.Kind {
	case SlidingLog:
		if l.Rate > MaxSlidingLogRate {
			return fmt.Errorf("%w: sliding_log requests_per_unit %d exceeds %d (one timestamp is stored per request); use sliding_window", ErrInvalidLimit, l.Rate, MaxSlidingLogRate)
		}
	case Concurrency:
		if l.Rate > MaxConcurrencyRate {
			return fmt.Errorf("%w: concurrency requests_per_unit %d exceeds %d", ErrInvalidLimit, l.Rate, MaxConcurrencyRate)
		}
	case TokenBucket:
		c := capacity(l)
		p := l.Period.Microseconds()
		if c >= MaxCost {
			return fmt.Errorf("%w: token_bucket capacity %d is not below the maximum cost 2^53", ErrInvalidLimit, c)
		}
		if c > 0 && (c > MaxExact/p || c > MaxExact/max(l.Rate, 1)) {
			return fmt.Errorf("%w: token_bucket burst %d × period %v exceeds 2^53 µs; use a shorter unit or a smaller burst", ErrInvalidLimit, c, l.Period)
		}
	default:
		if l.Rate >= MaxExact {
			return fmt.Errorf("%w: requests_per_unit %d exceeds 2^53", ErrInvalidLimit, l.Rate)
		}
	}
	return nil
}

// capacity is the token bucket capacity: Burst, or Rate when Burst is 0.
func capacity(l Limit) int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// periodUs is Period in whole microseconds (at least 1).
func periodUs(l Limit) int64 {
	p := l.Period.Microseconds()
	if p < 1 {
		p = 1
	}
	return p
}
