// The stored state of a key and the instant from which it is empty.

package algo

import "time"

// State is the stored state of one key; each field says which kinds use
// it. The zero value is the state of a key that was never used (or has
// expired), and every algorithm accepts it. A State is a value: functions
// in this package never modify one passed to them (nor its Log's backing
// array); they return a new one.
type State struct {
	// Time is the window start (FixedWindow, SlidingWindow) or the whole
	// microseconds of the TAT (TokenBucket), in µs since the Unix epoch;
	// 0 for the other kinds.
	Time int64
	// Count is the cost admitted in the window at Time (FixedWindow,
	// SlidingWindow) or the TAT fraction numerator in 1/Rate µs
	// (TokenBucket: the exact TAT is Time + Count/Rate, 0 <= Count < Rate).
	Count int64
	// Prev is the cost admitted in the window before Time (SlidingWindow
	// only).
	Prev int64
	// Log holds ascending µs timestamps: one per admitted unit of cost
	// (SlidingLog) or per live lease (Concurrency); nil for other kinds.
	Log []int64
	// Denials is the count of a penalty box's denials (Hit.Penalty) in
	// the window that ends at DenialsEnd (µs); both 0 when none is open.
	Denials, DenialsEnd int64
	// BlockEnd is the end (µs) of the penalty box's block; a block is in
	// force while it is after now.
	BlockEnd int64
}

// ExpiresAt returns the instant from which s is equivalent to the zero
// State for l (the counter reset, the bucket is full, the log is empty), so
// a store may drop the key (a penalty box's count and block included); the
// zero time.Time when s is already empty.
func ExpiresAt(l Limit, s State) time.Time {
	us := ExpiresAtUs(l, s)
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// ExpiresAtUs is ExpiresAt in microseconds since the epoch; 0 means
// already empty.
func ExpiresAtUs(l Limit, s State) int64 {
	return max(limitExpiresAtUs(l, s), penaltyExpiresUs(s))
}

// limitExpiresAtUs is ExpiresAtUs of the limit's fields of s only.
func limitExpiresAtUs(l Limit, s State) int64 {
	switch l.Kind {
	case FixedWindow:
		if s.Count == 0 {
			return 0
		}
		_, end := WindowBoundsUs(l, s.Time)
		return end
	case SlidingWindow:
		_, end := WindowBoundsUs(l, s.Time)
		if s.Count > 0 {
			_, end = WindowBoundsUs(l, end)
			return end
		}
		if s.Prev > 0 {
			return end
		}
		return 0
	case TokenBucket:
		if s.Time == 0 && s.Count == 0 {
			return 0
		}
		if s.Count > 0 {
			return s.Time + 1
		}
		return s.Time
	default: // SlidingLog, Concurrency
		if len(s.Log) == 0 {
			return 0
		}
		return s.Log[len(s.Log)-1] + periodUs(l)
	}
}
