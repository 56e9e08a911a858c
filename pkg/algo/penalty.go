// The penalty box: a hit's limit decision wrapped by a count of its
// denials and a block. The Redis script's take/45_penalty.lua ports it.

package algo

import "time"

// Penalty is a rule's penalty box: a client whose hit is denied After
// times within Within is denied for Block from the denial that reached
// After. The zero value (After 0) is no penalty. Values are validated at
// config load: After >= 1, Within and Block at least 1 µs.
type Penalty struct {
	// After is the number of denials within Within that starts a block.
	After int64
	// Within is the length of the denial-counting window, which opens at
	// the first denial counted in it.
	Within time.Duration
	// Block is how long a started block denies every hit.
	Block time.Duration
	// Extend makes every denial during a block restart it (Block from
	// that denial); without it a block ends Block after it started.
	Extend bool
}

// On reports whether p is a penalty box (After > 0).
func (p Penalty) On() bool { return p.After > 0 }

// PenaltyOutcome says what a hit's penalty box did to its decision.
type PenaltyOutcome uint8

const (
	// PenaltyNone: the decision is the limit's.
	PenaltyNone PenaltyOutcome = iota
	// PenaltyStarted: the limit denied the hit and that denial started a
	// block; the decision waits for the block's end.
	PenaltyStarted
	// PenaltyBlocked: the hit was denied by a block in force, without
	// deciding the limit.
	PenaltyBlocked
)

// Penalized reports whether h's penalty box applies: h has one and is a
// take that can fail its request (a Soft hit, shadow or quota mode, never
// counts denials or blocks; a release is always allowed). Only such a hit
// keeps its denial count and block when its request is denied.
func (h Hit) Penalized() bool { return h.Penalty.On() && !h.Soft && !h.Release }

// applyPenalty is Apply for a penalized hit at t (µs): while a block is in
// force the hit is denied without deciding the limit (with Extend the
// block restarts at t); otherwise the limit decides and a denial is
// counted in a window of Within opened by the first denial, and the
// After-th denial starts a block (the count starts again from 0). A
// decision a block makes is denied with Remaining 0 and RetryAfter,
// ResetAfter and WindowAfter all the time until the block's end.
func applyPenalty(prev State, h Hit, t int64) (State, decision, PenaltyOutcome) {
	p := h.Penalty
	block := max(p.Block.Microseconds(), 1)
	if prev.BlockEnd > t {
		ns := prev
		if p.Extend {
			ns.BlockEnd = max(ns.BlockEnd, t+block)
		}
		return ns, blocked(ns.BlockEnd - t), PenaltyBlocked
	}
	o := opTake
	if h.Charge {
		o = opCharge
	}
	ns, d := decide(h.Limit, prev, t, h.Cost, o)
	// an allowed hit leaves the box as it is (a store need not write it;
	// an ended block or count window reads as empty)
	ns = KeepPenalty(ns, prev)
	if d.allowed {
		return ns, d, PenaltyNone
	}
	if ns.DenialsEnd <= t { // the count window ended: a new one opens
		ns.Denials, ns.DenialsEnd = 0, 0
	}
	if ns.Denials == 0 {
		ns.DenialsEnd = t + max(p.Within.Microseconds(), 1)
	}
	ns.Denials++
	if ns.Denials < p.After {
		return ns, d, PenaltyNone
	}
	ns.Denials, ns.DenialsEnd, ns.BlockEnd = 0, 0, t+block
	return ns, blocked(block), PenaltyStarted
}

// blocked is the decision of a hit denied by a block ending in w µs.
func blocked(w int64) decision {
	return decision{retryUs: w, resetUs: w, windowUs: w}
}

// KeepPenalty returns st with the penalty box fields of from: what a
// store keeps of a penalized hit that denied when its request is denied
// and rolled back (its limit state is rolled back, its denial count and
// block are not).
func KeepPenalty(st, from State) State {
	st.Denials, st.DenialsEnd, st.BlockEnd = from.Denials, from.DenialsEnd, from.BlockEnd
	return st
}

// penaltyExpiresUs is the instant from which the penalty box fields of s
// are empty: the later of the block's end and the denial window's end.
func penaltyExpiresUs(s State) int64 { return max(s.BlockEnd, s.DenialsEnd) }
