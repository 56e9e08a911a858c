package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Numeric bounds enforced at load, on top of algo.Limit.Validate (which
// keeps every integer the algorithms and the Redis script use below 2^53:
// Lua numbers are IEEE-754 doubles and times are integer microseconds).
const (
	// MaxRequestsPerUnit is the largest requests_per_unit and burst: the
	// Envoy proto field RateLimitResponse.RateLimit.requests_per_unit is a
	// uint32.
	MaxRequestsPerUnit = 1<<32 - 1
	// MaxSlidingLogRate bounds requests_per_unit of a sliding_log limit
	// (algo.MaxSlidingLogRate): the log keeps one entry per admitted unit
	// of cost. Larger limits must use sliding_window.
	MaxSlidingLogRate = algo.MaxSlidingLogRate
	// MaxWindow bounds unit × unit_multiplier: 36,500 days (100 years of
	// 365 days, within algo.MaxPeriod).
	MaxWindow = 100 * 365 * 24 * time.Hour
)

var unitNames = [...]string{UnitUnknown: "UNKNOWN", Second: "SECOND", Minute: "MINUTE", Hour: "HOUR", Day: "DAY", Week: "WEEK", Month: "MONTH", Year: "YEAR"}

var unitDurations = [...]time.Duration{
	Second: time.Second,
	Minute: time.Minute,
	Hour:   time.Hour,
	Day:    24 * time.Hour,
	Week:   7 * 24 * time.Hour,
	Month:  30 * 24 * time.Hour,  // envoyproxy/ratelimit: fixed 30 days
	Year:   365 * 24 * time.Hour, // envoyproxy/ratelimit: fixed 365 days
}

// String returns the unit as the Envoy RateLimitUnit enum spells it
// ("SECOND" … "YEAR", "UNKNOWN").
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// Valid reports whether u is one of Second … Year.
func (u Unit) Valid() bool { return u >= Second && u <= Year }

// Duration is the unit's nominal length: 1 s … 7 days, 30 days for Month,
// 365 days for Year (envoyproxy/ratelimit's fixed lengths). 0 when invalid.
func (u Unit) Duration() time.Duration {
	if !u.Valid() {
		return 0
	}
	return unitDurations[u]
}

// ParseUnit parses a config unit name, case-insensitively ("second" …
// "year"). ok is false for anything else.
func ParseUnit(s string) (u Unit, ok bool) {
	for i := Second; i <= Year; i++ {
		if strings.EqualFold(s, unitNames[i]) {
			return i, true
		}
	}
	return UnitUnknown, false
}

var algoNames = [...]string{
	algo.FixedWindow:   "fixed_window",
	algo.SlidingWindow: "sliding_window",
	algo.SlidingLog:    "sliding_log",
	algo.TokenBucket:   "token_bucket",
	algo.Concurrency:   "concurrency",
}

// AlgorithmName returns the config name of k ("fixed_window", …), or
// "algorithm(N)" for an unknown kind.
func AlgorithmName(k algo.Kind) string {
	if int(k) < len(algoNames) {
		return algoNames[k]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(k))
}

func parseAlgorithm(s string) (algo.Kind, bool) {
	for i, n := range algoNames {
		if s == n {
			return algo.Kind(i), true
		}
	}
	return 0, false
}

var failureNames = [...]string{FailOpen: "open", FailClosed: "closed", FailLocal: "local"}

// String returns the config name of the failure mode: "open", "closed",
// "local".
func (f FailureMode) String() string {
	if int(f) < len(failureNames) {
		return failureNames[f]
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(f))
}

var consistencyNames = [...]string{Exact: "exact", Leased: "leased"}

// String returns the config name: "exact" or "leased".
func (c Consistency) String() string {
	if int(c) < len(consistencyNames) {
		return consistencyNames[c]
	}
	return fmt.Sprintf("Consistency(%d)", uint8(c))
}

var countingNames = [...]string{CountingDefault: "", AllOrNothing: "all_or_nothing", AlwaysCharge: "always_charge"}

// String returns the config spelling: "all_or_nothing", "always_charge",
// or "" for CountingDefault.
func (c Counting) String() string {
	if int(c) < len(countingNames) {
		return countingNames[c]
	}
	return fmt.Sprintf("Counting(%d)", uint8(c))
}

// ParseCounting parses "all_or_nothing" or "always_charge" (the config
// field `counting:` and the --counting flag; case-sensitive, as every
// config enum).
func ParseCounting(s string) (Counting, error) {
	switch s {
	case "all_or_nothing":
		return AllOrNothing, nil
	case "always_charge":
		return AlwaysCharge, nil
	}
	return CountingDefault, fmt.Errorf("policy: invalid counting %q: want all_or_nothing or always_charge", s)
}

func parseFailureMode(s string) (FailureMode, bool) {
	for i, n := range failureNames {
		if s == n {
			return FailureMode(i), true
		}
	}
	return 0, false
}
