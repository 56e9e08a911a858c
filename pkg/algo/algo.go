// Package algo holds the vocabulary of ratelimitd (Limit, Hit, Decision,
// State) and the pure rate-limiting algorithms: fixed window, sliding window
// counter, sliding window log, token bucket (GCRA) and concurrency leases.
//
// Every function takes the current instant as an argument; nothing in this
// package reads a clock, starts a goroutine or touches global state. The
// Redis backend implements the same algorithms in Lua; the conformance suite
// in package algotest proves both agree step by step.
//
// The package imports the standard library only.
package algo

import "time"

// Kind names an algorithm. The zero value is FixedWindow, the behaviour of
// envoyproxy/ratelimit.
type Kind uint8

const (
	// FixedWindow counts cost per epoch-aligned window of length Period
	// (window start = floor(now/Period)*Period). Config name "fixed_window".
	FixedWindow Kind = iota
	// SlidingWindow is the sliding window counter: the estimate
	// prev*(1-elapsed/Period) + curr over two epoch-aligned windows.
	// Config name "sliding_window".
	SlidingWindow
	// SlidingLog keeps one timestamp per admitted unit of cost and admits
	// while fewer than Rate timestamps lie in (now-Period, now]. Exact.
	// Config name "sliding_log".
	SlidingLog
	// TokenBucket is GCRA: Rate tokens per Period, capacity Burst, state is
	// the theoretical arrival time (TAT). Config name "token_bucket".
	TokenBucket
	// Concurrency holds at most Rate leases at once; each lease expires
	// Period after it was taken unless released earlier. Config name
	// "concurrency".
	Concurrency
)

// Calendar selects calendar-aligned windows for MONTH and YEAR units.
// The zero value CalendarNone means epoch-aligned windows of fixed Period
// (30 and 365 days, as envoyproxy/ratelimit does).
type Calendar uint8

const (
	// CalendarNone: windows are epoch-aligned and Period long (the
	// zero value).
	CalendarNone Calendar = iota
	// CalendarMonth: windows are UTC calendar months × Multiplier
	// (months counted from January 1970).
	CalendarMonth
	// CalendarYear: windows are UTC calendar years × Multiplier
	// (years counted from 1970).
	CalendarYear
)

// Limit is one compiled rate limit. Values are validated at config load;
// algorithms may assume Rate > 0 (or Rate == 0 meaning "deny everything",
// the envoyproxy/ratelimit meaning of requests_per_unit: 0), Period > 0,
// Burst >= 0.
type Limit struct {
	// Kind is the algorithm; the zero value is FixedWindow.
	Kind Kind
	// Rate is the number of requests (units of cost) admitted per Period;
	// for Concurrency, the number of leases held at once.
	Rate int64
	// Period is the window length (unit × unit_multiplier) or the token
	// bucket refill period, or the Concurrency lease lifetime. Whole
	// microseconds (the Redis script's resolution).
	Period time.Duration
	// Burst is the token bucket capacity in requests; 0 means Rate.
	// Ignored by other kinds.
	Burst int64
	// Calendar, when not CalendarNone, replaces Period-based window
	// alignment by calendar months or years; Multiplier counts them.
	Calendar Calendar
	// Multiplier is the config's unit_multiplier for a calendar window:
	// one window spans Multiplier UTC months ([1, 1200]) or years
	// ([1, 100]), checked by Validate. Ignored with CalendarNone, where
	// Period already includes the multiplier.
	Multiplier int64
}

// Hit is one limit to apply within a request: the backend key (already
// injective over domain, rule, limit and descriptor entries; see
// policy.Set.Key), the limit, and the cost.
type Hit struct {
	// Key identifies the counter state. Backends may append a window
	// suffix; they never parse it.
	Key string
	// Limit is the compiled limit the hit is decided against.
	Limit Limit
	// Cost is the number of units to take (hits_addend). 0 means check
	// only: consume nothing, deny only when nothing at all remains.
	// Never negative; at most MaxCost (stores treat a larger cost as
	// MaxCost, which every limit denies).
	Cost int64
	// Soft marks a hit whose denial does not fail the request (shadow mode,
	// quota mode): stores still decide it and write nothing for it when it
	// is denied, but they do not roll back the request's other hits.
	Soft bool
	// Release returns Cost units instead of taking them (a refund: Envoy's
	// RateLimitDescriptor.is_negative_hits, or a concurrency lease
	// release): Concurrency leases the oldest first, SlidingLog entries
	// the newest first, FixedWindow and SlidingWindow counts (the current
	// window's, then the previous one's) floored at 0, TokenBucket tokens
	// up to the capacity (the TAT moves back, never before now). A release
	// is always allowed and is kept even when the request is denied (see
	// Charge). Cost 0 releases nothing.
	Release bool
	// Charge selects the always_charge counting policy for this hit: a
	// take that is denied still consumes its Cost (the counter goes over
	// the limit, the bucket into debt; see Charge), and the hit is kept
	// when another hit of the request denies it, as envoyproxy/ratelimit
	// counts every hits_addend. Without Charge (all_or_nothing), a denied
	// request consumes nothing. A check (Cost 0) consumes nothing either
	// way. Charge does not apply to Concurrency limits: a lease is never
	// charged when denied and is rolled back with its denied request, as
	// a denied request sends no release (see Kept).
	Charge bool
	// Penalty is the rule's penalty box (the zero value: none). A hit
	// with one is first denied by a block in force, and its denials are
	// counted toward a block (see Apply). Soft hits and releases ignore
	// it. A store keeps a penalized hit's denial count and block when its
	// request is denied (KeepPenalty), as it keeps Kept hits.
	Penalty Penalty
}

// Kept reports whether a store keeps h's effect when its request is
// denied: releases, and always_charge hits of every kind but Concurrency
// (see Hit.Charge).
func (h Hit) Kept() bool { return h.Release || (h.Charge && h.Limit.Kind != Concurrency) }

// Decision is the outcome of one Hit.
type Decision struct {
	// Allowed reports whether the hit may pass.
	Allowed bool
	// Remaining is the number of whole units admissible right after this
	// decision (>= 0, rounded down). When a request is denied as a whole,
	// backends report the value before the request for the hits that did
	// not deny and are not Kept (nothing was consumed); Kept hits report
	// the state after their own hit.
	Remaining int64
	// RetryAfter is 0 when Allowed; otherwise the wait until the same cost
	// can pass (exact, before rounding).
	RetryAfter time.Duration
	// ResetAfter is the time until the state is full again (the counter
	// resets, the bucket refills, the log empties). It is the minimum TTL
	// of the backend key and the source of duration_until_reset.
	ResetAfter time.Duration
	// WindowAfter is the draft-ietf-httpapi-ratelimit-headers "t": seconds
	// within which the client can use no more than Remaining; for windows
	// it equals ResetAfter, for a token bucket that is not full it is the
	// time until the next token.
	WindowAfter time.Duration
	// FromCache reports a denial the store's local over-limit cache held
	// (envoyproxy/ratelimit's over_limit_with_local_cache): answered
	// without a backend round trip or, when the backend had to decide the
	// rest of the request with it, confirmed by the backend. false for
	// every other decision.
	FromCache bool
	// Penalty says whether the hit's penalty box started a block with
	// this denial or denied it by a block in force (Hit.Penalty).
	Penalty PenaltyOutcome
}
