// # Porting contract
//
// The Redis script (pkg/backend/redis) must return bit-identical decisions
// for the same (Limit, State, now, cost). The conformance suite
// (pkg/algo/algotest) and the step-by-step agreement test check it. This
// section is the reference; take.go (the algorithms), limit.go (the bounds),
// state.go (expiry) and calendar.go are the executable form.
//
// Units. now is t = integer microseconds since the Unix epoch (Go:
// now.UnixMicro(); Redis: TIME as sec*1000000+usec). P = Period in whole µs.
// R = Rate, C = capacity (Burst, or Rate when Burst is 0). Every stored
// value is an integer below 2^53 (MaxExact), so Go int64 and Lua doubles
// hold the same values. Integer division a/b below means floor(a/b) with
// a >= 0 and b > 0 (Lua: math.floor(a / b), exact for a < 2^53); a%b =
// a - b*floor(a/b). Where floating point is used, each operation is one
// IEEE-754 double operation in the order written (Go forbids fusing them
// into FMA through explicit float64() conversions; Lua 5.1 does not fuse),
// floor is math.floor.
//
// Common rules. cost is first clamped to [0, MaxCost] (ClampCost; the
// script receives costs already clamped and rejects, per segment, any
// outside [-2^53, 2^53]). need = max(cost, 1): a check (cost 0) is
// admitted when one unit would be, and consumes nothing. rem is the whole units remaining
// before the hit; the hit is allowed iff need <= rem. Denied hits and
// checks write nothing (the state stays byte for byte as it was; in
// Redis: no write, no TTL change). Rate 0 denies every hit (check
// included) with RetryAfter = ResetAfter = WindowAfter = time to the end of
// the current window for FixedWindow and SlidingWindow, P for the others.
// A cost above the capacity is denied and, as it can never pass, gets
// RetryAfter = time to the current window end (FixedWindow, SlidingWindow)
// or P (TokenBucket, SlidingLog, Concurrency). Durations are returned in
// µs; Remaining is never negative.
//
// Windows: [ws, we) = WindowBoundsUs(l, t): ws = floor(t/P)*P, we = ws+P,
// or calendar months/years (month index mi = (year-1970)*12 + month-1 from
// civilFromDays(floor(t/86400e6)); k = floor(mi/M)*M; ws = start of month
// k, we = start of month k+M; years likewise), using Howard Hinnant's
// days_from_civil / civil_from_days exactly as in calendar.go.
//
// FixedWindow, state {Time: window start, Count}.
//
//	if Time == ws: count = Count
//	elif Time > ws: ws = Time; we = end of Time's window; count = Count  (clock went back)
//	else: count = 0
//	rem = max(R - count, 0); reset = we - t
//	denied: RetryAfter = reset; allowed with cost > 0: store {ws, count+cost}
//	Remaining = rem (denied/check) or rem - cost; ResetAfter = WindowAfter = reset
//
// SlidingWindow, state {Time: current window start, Count: curr, Prev}.
//
//	if Time == ws: curr, prev = Count, Prev
//	elif Time > ws: ws = Time; we = end of Time's window; curr, prev = Count, Prev
//	elif Time == start of the window containing ws-1: curr, prev = 0, Count
//	else: curr, prev = 0, 0
//	tw = max(t, ws); we2 = end of the window containing we
//	w   = double(we - tw) / double(we - ws)
//	est = double(double(prev) * w) + double(curr)
//	rem = max(floor(double(R) - est), 0)
//	wait(k) (time until est <= R-k):
//	    avail = R - k - curr
//	    if avail >= 0 and prev > 0: x = double(double(avail)*double(we-ws)) / double(prev); t2 = we - floor(x)
//	    elif curr > 0:              x = double(double(R-k)*double(we2-we)) / double(curr); t2 = we2 - floor(x)
//	    else: t2 = t + 1
//	    wait = max(t2 - t, 1)
//	denied: RetryAfter = wait(need) (need <= R) else we - t
//	allowed with cost > 0: curr += cost; rem -= cost; store {ws, curr, prev}
//	ResetAfter = (curr > 0 ? we2 : we) - t          (curr after the hit)
//	WindowAfter = rem >= R ? we - t : wait(rem + 1) (rem, curr after the hit)
//
// Approximation: the estimate assumes the previous window's hits were
// spread evenly. It never admits more than 2R in any interval of length P
// (property-tested) and is exact when traffic is uniform.
//
// TokenBucket (GCRA), state {Time: TAT µs, Count: TAT fraction f in
// units of 1/R µs}. The emission interval T = P/R is kept as q = P/R,
// m = P%R (T = q + m/R); all arithmetic is integer and exact:
//
//	tat, f = Time, Count; if f < 0 or f >= R: tat, f = tat+1, 0
//	if tat < t: tat, f = t, 0
//	tau = C*T:  tauUs = C*q + (C*m)/R, tauF = (C*m)%R
//	slack S = tau - (TAT - t): sUs = tauUs - (tat - t), sF = tauF - f; if sF < 0: sF += R, sUs -= 1
//	rem = sUs >= 0 ? (sUs*R + sF) / P : 0
//	waitFor(k) = ceil(k*T - S): du = k*q + (k*m)/R - sUs, df = (k*m)%R - sF;
//	             if df < 0: df += R, du -= 1;  if df > 0: du += 1
//	fullIn = (tat - t) + (f > 0 ? 1 : 0), at least 0
//	denied: RetryAfter = need <= C ? waitFor(need) : P
//	allowed with cost > 0: n = f + cost*m; tat = tat + cost*q + n/R; f = n%R;
//	        store {tat, f}; recompute S with the new tat, f; rem -= cost
//	ResetAfter = fullIn (state after the hit)
//	WindowAfter = (rem >= C or fullIn == 0) ? q + min(m, 1) : waitFor(rem+1)
//
// Bounds (Limit.Validate): C*P <= 2^53 and C*R <= 2^53, so sUs*R, cost*m
// and C*q stay exact.
//
// SlidingLog and Concurrency, state {Log: ascending µs timestamps}. An
// entry is live while entry > t - P (a Concurrency lease expires P after it
// was taken).
//
//	lv = live entries; rem = max(R - len(lv), 0)
//	denied: RetryAfter = need <= R ? lv[len(lv)+need-R-1] + P - t : P   (0-based)
//	allowed with cost > 0: ts = max(t, last(lv)); store lv followed by cost copies of ts; rem -= cost
//	ResetAfter = empty ? 0 : last + P - t;  WindowAfter = empty ? P : first + P - t
//	Release (Concurrency, Hit.Release): drop min(cost, len(lv)) oldest live
//	entries; always allowed; Remaining = R - live after; RetryAfter 0.
//
// Charge (Hit.Charge, the always_charge counting policy) is Take except
// in the denied branch with cost > 0 and Rate > 0, for every kind but
// Concurrency (Charge is Take there):
//
//	FixedWindow:   store {ws, min(count+cost, 2^53)}; Remaining 0; durations as denied
//	SlidingWindow: curr = min(curr+cost, 2^53); rem = remaining(curr); store {ws, curr, prev};
//	               RetryAfter = need <= R ? wait(need) : we - t; reset, window with the new curr
//	TokenBucket:   bound B = t + 2*tau (bUs = t + 2*tauUs + (2*tauF)/R, bF = (2*tauF)%R);
//	               up to two steps k = min(left, C): TAT += k*T; if TAT > B: TAT = B, or the
//	               TAT before the charge if that was already > B, and stop;
//	               store it; recompute S and rem; RetryAfter = need <= C ? waitFor(need) : P
//	SlidingLog:    k = min(cost, 2R - len(lv)); if k > 0 append k copies of ts (as a take);
//	               rem = max(R - len, 0); RetryAfter from the new log
//
// Release (Hit.Release, a refund) for kinds other than Concurrency: a
// credit of n = clamped cost when n > 0 and Rate > 0, then the decision of
// a check (cost 0) on the credited state with allowed = true and
// RetryAfter = 0 (Rate 0: the Rate 0 durations, allowed, Remaining 0):
//
//	FixedWindow:   if Time >= ws and Count > 0: c = max(Count-n, 0); c == 0 ? zero State : {Time, c}
//	SlidingWindow: resolve (ws, curr, prev) as a take does (Time >= ws: the stored window);
//	               if both 0: unchanged; c = max(curr-n, 0); p = max(prev-(n-(curr-c)), 0);
//	               both 0 ? zero State : {ws, c, p}
//	TokenBucket:   normalise (tat, f) as a take does; if tat < t: unchanged; up to two
//	               steps k = min(left, C): TAT -= k*T (f -= (k*m)%R with borrow), stop once tat < t;
//	               tat < t or (tat == t and f == 0) ? zero State : {tat, f}
//	SlidingLog:    drop the min(n, len(lv)) newest live entries (empty: zero State)
//
// In Redis a sorted set with score = timestamp needs unique members for
// equal timestamps (e.g. "<ts>:<seq>"); the Go log simply repeats the value.
// The log holds at most Rate entries (MaxSlidingLogRate,
// MaxConcurrencyRate).
//
// Expiry. ExpiresAtUs gives the instant from which a state equals the zero
// State: fixed window end (Count > 0); sliding window: end of the window
// after Time's (Count > 0) or of Time's window (Prev > 0); token bucket:
// ceil(TAT); logs: last + P. A store may delete the key from then on (Redis
// PEXPIREAT, or PEXPIRE of the difference, rounded up to the millisecond).
//
// Multi-hit requests (the Store contract): hits are applied in request
// order, a hit on a key already touched by the request sees the tentative
// state left by the earlier hit; if any hit that is not Soft is denied (a
// check-only hit with Cost 0 included: the request is then denied), the
// request is replayed on the states before it with its Kept hits only
// (Hit.Kept: releases, and Charge hits of every kind but Concurrency):
// they are written and report their replayed decision; every other hit
// that was not itself denied reports a check on its key's replayed state
// at its place (the state before the request when no Kept hit precedes
// it on that key), and hits that denied keep their decision. A Penalized
// hit (Hit.Penalized) that denied and is not Kept writes its penalty box
// as it stood after that hit (KeepPenalty); a Soft hit writes none. Without
// Kept or such hits, nothing is written (see algotest.Reference).
package algo
