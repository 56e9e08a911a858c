// The decisions (Take, Charge, Release, Apply) and one function per
// algorithm: the Redis script's take/5x_*.lua and take/60_log.lua port
// these functions line by line, under the names they cite.

package algo

import "time"

// decision is a Decision in integer microseconds.
type decision struct {
	allowed                    bool
	remaining                  int64
	retryUs, resetUs, windowUs int64
}

func (d decision) out() Decision {
	return Decision{
		Allowed:     d.allowed,
		Remaining:   max(d.remaining, 0),
		RetryAfter:  MicrosDuration(d.retryUs),
		ResetAfter:  MicrosDuration(max(d.resetUs, 0)),
		WindowAfter: MicrosDuration(max(d.windowUs, 0)),
	}
}

// maxDurationUs is the largest whole number of microseconds a
// time.Duration holds (about 292 years).
const maxDurationUs = int64(1<<63-1) / int64(time.Microsecond)

// MicrosDuration converts a decision's integer microseconds to a
// time.Duration, saturating at about 292 years (a token bucket of extreme
// burst × period in debt can be further away than a Duration reaches).
// Stores convert the Redis script's durations with it too.
func MicrosDuration(us int64) time.Duration {
	return time.Duration(min(us, maxDurationUs)) * time.Microsecond
}

// Take applies cost units of l to prev at now and returns the next state and
// the decision. cost 0 is a check: it consumes nothing and is denied only
// when not even one unit remains. A denied hit and a check return prev
// unchanged. A cost above the capacity (Rate, or Burst for a token bucket)
// is always denied. Negative costs count as 0, costs above MaxCost as
// MaxCost (ClampCost).
func Take(l Limit, prev State, now time.Time, cost int64) (State, Decision) {
	s, d := decide(l, prev, now.UnixMicro(), cost, opTake)
	return s, d.out()
}

// Charge is Take under the always_charge counting policy (Hit.Charge): a
// denied take with cost > 0 is still charged, and its decision describes
// the state after the charge (Remaining 0). The overdraft is bounded: a
// token bucket goes at most one capacity into debt, a sliding log holds
// at most 2·Rate entries (the porting contract in doc.go has the rules).
// Concurrency and Rate 0 limits are never charged when denied.
func Charge(l Limit, prev State, now time.Time, cost int64) (State, Decision) {
	s, d := decide(l, prev, now.UnixMicro(), cost, opCharge)
	return s, d.out()
}

// Release returns n units instead of taking them: a refund (Envoy's
// is_negative_hits) or a concurrency lease release. It is always allowed
// and its decision is a check on the state after the release. Counts are
// floored at 0 and a token bucket's TAT never moves before now; Hit.Release
// says what each kind gives back.
func Release(l Limit, prev State, now time.Time, n int64) (State, Decision) {
	s, d := decide(l, prev, now.UnixMicro(), n, opRelease)
	return s, d.out()
}

// Apply is Release, Charge or Take as h.Release and h.Charge say, on
// h.Limit and h.Cost. A take that is not Soft runs inside h's penalty box
// when it has one: a block in force denies it until the block's end, and
// the Penalty.After-th denial within Penalty.Within starts a block
// (Decision.Penalty says which).
func Apply(prev State, h Hit, now time.Time) (State, Decision) {
	if h.Penalized() {
		s, d, o := applyPenalty(prev, h, now.UnixMicro())
		out := d.out()
		out.Penalty = o
		return s, out
	}
	var s State
	var d Decision
	switch {
	case h.Release:
		s, d = Release(h.Limit, prev, now, h.Cost)
	case h.Charge:
		s, d = Charge(h.Limit, prev, now, h.Cost)
	default:
		s, d = Take(h.Limit, prev, now, h.Cost)
	}
	// a hit outside its penalty box (Soft, a release) leaves the box as
	// it is
	return KeepPenalty(s, prev), d
}

// op is what decide does: take (all_or_nothing), charge (always_charge)
// or release.
type op uint8

const (
	opTake op = iota
	opCharge
	opRelease
)

// decide dispatches on l.Kind; t is now in µs.
func decide(l Limit, st State, t, cost int64, o op) (State, decision) {
	cost = ClampCost(cost)
	if o == opRelease {
		return refund(l, st, t, cost)
	}
	charge := o == opCharge && cost > 0
	if l.Rate <= 0 {
		w := periodUs(l)
		if l.Kind == FixedWindow || l.Kind == SlidingWindow {
			_, end := WindowBoundsUs(l, t)
			w = end - t
		}
		return st, decision{retryUs: w, resetUs: w, windowUs: w}
	}
	switch l.Kind {
	case FixedWindow:
		return fixedWindow(l, st, t, cost, charge)
	case SlidingWindow:
		return slidingWindow(l, st, t, cost, charge)
	case TokenBucket:
		return tokenBucket(l, st, t, cost, charge)
	default: // SlidingLog, Concurrency: one timestamp per unit
		return timestampLog(l, st, t, cost, charge && l.Kind == SlidingLog)
	}
}

// refund is Release: the credited state and a check on it, allowed.
func refund(l Limit, st State, t, n int64) (State, decision) {
	if l.Kind == Concurrency {
		return release1(l, st, t, n)
	}
	ns := st
	if n > 0 && l.Rate > 0 {
		switch l.Kind {
		case FixedWindow:
			ns = creditFixed(l, st, t, n)
		case SlidingWindow:
			ns = creditSliding(l, st, t, n)
		case TokenBucket:
			ns = creditToken(l, st, t, n)
		default: // SlidingLog
			ns = creditLog(l, st, t, n)
		}
	}
	_, d := decide(l, ns, t, 0, opTake)
	d.allowed, d.retryUs = true, 0
	return ns, d
}

// creditFixed subtracts n from the count of the window fixedWindow would
// read at t (floored at 0); an earlier window's count has reset already.
func creditFixed(l Limit, st State, t, n int64) State {
	ws, _ := WindowBoundsUs(l, t)
	if st.Time < ws || st.Count <= 0 {
		return st
	}
	c := max(st.Count-n, 0)
	if c == 0 {
		return State{}
	}
	return State{Time: st.Time, Count: c}
}

// creditSliding subtracts n from the current window's count, then the
// rest from the previous window's, each floored at 0.
func creditSliding(l Limit, st State, t, n int64) State {
	ws, _ := WindowBoundsUs(l, t)
	var curr, prev int64
	if st.Time >= ws {
		ws, curr, prev = st.Time, st.Count, st.Prev
	} else if ps, _ := WindowBoundsUs(l, ws-1); st.Time == ps {
		prev = st.Count
	}
	if curr <= 0 && prev <= 0 {
		return st
	}
	c := max(curr-n, 0)
	p := max(prev-(n-(curr-c)), 0)
	if c == 0 && p == 0 {
		return State{}
	}
	return State{Time: ws, Count: c, Prev: p}
}

// creditToken moves the TAT back by n·T, in at most two steps of the
// capacity (every product stays below 2^53), never before t.
func creditToken(l Limit, st State, t, n int64) State {
	r := l.Rate
	b := capacity(l)
	p := periodUs(l)
	q, m := p/r, p%r
	tat, frac := st.Time, st.Count
	if frac < 0 || frac >= r {
		tat, frac = tat+1, 0
	}
	if tat < t {
		return st // full already
	}
	for range 2 {
		if n <= 0 {
			break
		}
		k := min(n, b)
		n -= k
		tat, frac = tat-(k*q+(k*m)/r), frac-(k*m)%r
		if frac < 0 {
			frac += r
			tat--
		}
		if tat < t {
			break
		}
	}
	if tat < t || (tat == t && frac == 0) {
		return State{}
	}
	return State{Time: tat, Count: frac}
}

// creditLog drops the n newest live SlidingLog entries.
func creditLog(l Limit, st State, t, n int64) State {
	lv := live(st.Log, t, periodUs(l))
	k := min(n, int64(len(lv)))
	if k == 0 {
		return st
	}
	if int64(len(lv)) == k {
		return State{}
	}
	nl := make([]int64, len(lv)-int(k))
	copy(nl, lv)
	return State{Log: nl}
}

// fixedWindow: see the porting contract in doc.go.
func fixedWindow(l Limit, st State, t, cost int64, charge bool) (State, decision) {
	ws, we := WindowBoundsUs(l, t)
	count := int64(0)
	if st.Time == ws {
		count = st.Count
	} else if st.Time > ws { // the clock went back into an earlier window: keep the later one
		ws = st.Time
		_, we = WindowBoundsUs(l, ws)
		count = st.Count
	}
	rem := max(l.Rate-count, 0)
	reset := we - t
	if max(cost, 1) > rem {
		if charge { // always_charge: over the limit, saturating at 2^53
			return State{Time: ws, Count: min(count+cost, MaxExact)}, decision{retryUs: reset, resetUs: reset, windowUs: reset}
		}
		return st, decision{remaining: rem, retryUs: reset, resetUs: reset, windowUs: reset}
	}
	if cost == 0 {
		return st, decision{allowed: true, remaining: rem, resetUs: reset, windowUs: reset}
	}
	return State{Time: ws, Count: count + cost}, decision{allowed: true, remaining: rem - cost, resetUs: reset, windowUs: reset}
}

// slidingWindow: see the porting contract in doc.go.
func slidingWindow(l Limit, st State, t, cost int64, charge bool) (State, decision) {
	ws, we := WindowBoundsUs(l, t)
	var curr, prev int64
	if st.Time == ws {
		curr, prev = st.Count, st.Prev
	} else if st.Time > ws { // clock went back into an earlier window: keep the later one
		ws = st.Time
		_, we = WindowBoundsUs(l, ws)
		curr, prev = st.Count, st.Prev
	} else if ps, _ := WindowBoundsUs(l, ws-1); st.Time == ps {
		prev = st.Count
	}
	tw := max(t, ws) // weights never exceed 1
	_, we2 := WindowBoundsUs(l, we)
	sw := swin{rate: l.Rate, t: t, tw: tw, ws: ws, we: we, we2: we2, prev: prev}
	rem := sw.remaining(curr)
	need := max(cost, 1)
	if need > rem {
		ns := st
		if charge { // always_charge: over the limit, saturating at 2^53
			curr = min(curr+cost, MaxExact)
			rem = sw.remaining(curr)
			ns = State{Time: ws, Count: curr, Prev: prev}
		}
		retry := we - t // never admissible
		if need <= l.Rate {
			retry = sw.wait(curr, need)
		}
		return ns, decision{remaining: rem, retryUs: retry, resetUs: sw.reset(curr), windowUs: sw.window(curr, rem)}
	}
	ns := st
	if cost > 0 {
		curr += cost
		rem -= cost
		ns = State{Time: ws, Count: curr, Prev: prev}
	}
	return ns, decision{allowed: true, remaining: rem, resetUs: sw.reset(curr), windowUs: sw.window(curr, rem)}
}

// swin holds the sliding window counter's inputs at one instant.
type swin struct {
	rate, t, tw, ws, we, we2, prev int64
}

// remaining returns max(0, floor(Rate - est)) with
// est = float64(float64(prev)*w) + float64(curr), w = (we-tw)/(we-ws).
func (s swin) remaining(curr int64) int64 {
	w := float64(s.we-s.tw) / float64(s.we-s.ws)
	est := float64(float64(s.prev)*w) + float64(curr)
	r := int64(floor(float64(s.rate) - est))
	return max(r, 0)
}

// wait returns the µs from t until est <= Rate-k (k <= Rate), at least 1.
func (s swin) wait(curr, k int64) int64 {
	var t2 int64
	if avail := s.rate - k - curr; avail >= 0 && s.prev > 0 {
		x := float64(float64(avail)*float64(s.we-s.ws)) / float64(s.prev)
		t2 = s.we - int64(floor(x))
	} else if curr > 0 {
		x := float64(float64(s.rate-k)*float64(s.we2-s.we)) / float64(curr)
		t2 = s.we2 - int64(floor(x))
	} else {
		t2 = s.t + 1
	}
	return max(t2-s.t, 1)
}

// reset returns the µs until the estimate is 0.
func (s swin) reset(curr int64) int64 {
	if curr > 0 {
		return s.we2 - s.t
	}
	return s.we - s.t
}

// window returns the µs until one more unit than rem is available (the
// draft's effective window), or until the window ends when rem >= Rate.
func (s swin) window(curr, rem int64) int64 {
	if rem >= s.rate {
		return s.we - s.t
	}
	return s.wait(curr, rem+1)
}

// floor is math.Floor without importing math into the porting surface.
func floor(x float64) float64 {
	i := float64(int64(x))
	if i > x {
		i--
	}
	return i
}

// tokenBucket: GCRA with an exact rational TAT; see the porting contract.
func tokenBucket(l Limit, st State, t, cost int64, charge bool) (State, decision) {
	r := l.Rate
	b := capacity(l)
	p := periodUs(l)
	q, m := p/r, p%r // emission interval T = q + m/r µs
	tat, frac := st.Time, st.Count
	if frac < 0 || frac >= r { // state from another rate: round the TAT up
		tat, frac = tat+1, 0
	}
	if tat < t {
		tat, frac = t, 0
	}
	// tau = b*T = (tauUs, tauFrac/r)
	tauUs, tauFrac := b*q+(b*m)/r, (b*m)%r
	// slack S = tau - (TAT - t) = (sUs, sFrac/r), 0 <= sFrac < r
	sUs, sFrac := tauUs-(tat-t), tauFrac-frac
	if sFrac < 0 {
		sFrac += r
		sUs--
	}
	rem := int64(0)
	if sUs >= 0 {
		rem = (sUs*r + sFrac) / p
	}
	// waitFor returns the µs until the slack reaches k*T: ceil(k*T - S).
	waitFor := func(sUs, sFrac, k int64) int64 {
		du, df := k*q+(k*m)/r-sUs, (k*m)%r-sFrac
		if df < 0 {
			df += r
			du--
		}
		if df > 0 {
			du++
		}
		return du
	}
	fullIn := func(tat, frac int64) int64 { // ceil(TAT - t)
		d := tat - t
		if frac > 0 {
			d++
		}
		return max(d, 0)
	}
	next := func(tat, frac, sUs, sFrac, rem int64) int64 { // effective window
		if rem >= b || fullIn(tat, frac) == 0 {
			return q + min(m, 1) // full: ceil(T)
		}
		return waitFor(sUs, sFrac, rem+1)
	}
	need := max(cost, 1)
	if need > rem {
		ns := st
		if charge {
			// always_charge: TAT += cost*T in at most two steps of b (every
			// product stays below 2^53), at most t + 2*tau (one capacity
			// of debt), never moved back.
			bUs, bF := t+2*tauUs+(2*tauFrac)/r, (2*tauFrac)%r
			nt, nf, left := tat, frac, cost
			for range 2 {
				if left <= 0 {
					break
				}
				k := min(left, b)
				left -= k
				n := nf + k*m
				nt, nf = nt+k*q+n/r, n%r
				if nt > bUs || (nt == bUs && nf > bF) {
					nt, nf = bUs, bF
					if tat > bUs || (tat == bUs && frac > bF) {
						nt, nf = tat, frac
					}
					break
				}
			}
			tat, frac = nt, nf
			sUs, sFrac = tauUs-(tat-t), tauFrac-frac
			if sFrac < 0 {
				sFrac += r
				sUs--
			}
			rem = 0
			if sUs >= 0 {
				rem = (sUs*r + sFrac) / p
			}
			ns = State{Time: tat, Count: frac}
		}
		retry := p
		if need <= b {
			retry = waitFor(sUs, sFrac, need)
		}
		return ns, decision{remaining: rem, retryUs: retry, resetUs: fullIn(tat, frac), windowUs: next(tat, frac, sUs, sFrac, rem)}
	}
	if cost == 0 {
		return st, decision{allowed: true, remaining: rem, resetUs: fullIn(tat, frac), windowUs: next(tat, frac, sUs, sFrac, rem)}
	}
	// TAT += cost*T
	n := frac + cost*m
	tat, frac = tat+cost*q+n/r, n%r
	sUs, sFrac = tauUs-(tat-t), tauFrac-frac
	if sFrac < 0 {
		sFrac += r
		sUs--
	}
	rem -= cost
	return State{Time: tat, Count: frac}, decision{allowed: true, remaining: rem, resetUs: fullIn(tat, frac), windowUs: next(tat, frac, sUs, sFrac, rem)}
}

// live returns the suffix of log with timestamps > t - P (not expired).
func live(log []int64, t, p int64) []int64 {
	i := 0
	for i < len(log) && log[i] <= t-p {
		i++
	}
	return log[i:]
}

// logDecision fills the durations of a log-based decision.
func logDecision(d decision, lv []int64, t, p int64) decision {
	if len(lv) > 0 {
		d.resetUs = lv[len(lv)-1] + p - t
		d.windowUs = lv[0] + p - t
	} else {
		d.windowUs = p
	}
	return d
}

// timestampLog is SlidingLog and Concurrency take: one timestamp per unit.
func timestampLog(l Limit, st State, t, cost int64, charge bool) (State, decision) {
	p := periodUs(l)
	lv := live(st.Log, t, p)
	rem := max(l.Rate-int64(len(lv)), 0)
	need := max(cost, 1)
	ns := st
	if need > rem && charge {
		// always_charge (SlidingLog): the log grows to at most 2*Rate.
		if k := min(cost, 2*l.Rate-int64(len(lv))); k > 0 {
			ts := t
			if len(lv) > 0 {
				ts = max(ts, lv[len(lv)-1])
			}
			nl := make([]int64, len(lv), len(lv)+int(k))
			copy(nl, lv)
			for range k {
				nl = append(nl, ts)
			}
			lv = nl
			ns = State{Log: nl}
			rem = max(l.Rate-int64(len(lv)), 0)
		}
	}
	if need > rem {
		retry := p
		if need <= l.Rate {
			e := int64(len(lv)) + need - l.Rate // entries that must expire
			retry = lv[e-1] + p - t
		}
		return ns, logDecision(decision{remaining: rem, retryUs: retry}, lv, t, p)
	}
	if cost == 0 {
		return st, logDecision(decision{allowed: true, remaining: rem}, lv, t, p)
	}
	ts := t
	if len(lv) > 0 {
		ts = max(ts, lv[len(lv)-1]) // keep the log sorted if the clock went back
	}
	nl := make([]int64, len(lv), len(lv)+int(cost))
	copy(nl, lv)
	for range cost {
		nl = append(nl, ts)
	}
	return State{Log: nl}, logDecision(decision{allowed: true, remaining: rem - cost}, nl, t, p)
}

// release1 returns n Concurrency leases, oldest first.
func release1(l Limit, st State, t, n int64) (State, decision) {
	p := periodUs(l)
	lv := live(st.Log, t, p)
	ns := st
	if n > 0 {
		k := min(n, int64(len(lv)))
		nl := make([]int64, len(lv)-int(k))
		copy(nl, lv[k:])
		lv = nl
		ns = State{Log: nl}
		if len(nl) == 0 {
			ns = State{}
		}
	}
	rem := max(l.Rate-int64(len(lv)), 0)
	return ns, logDecision(decision{allowed: true, remaining: rem}, lv, t, p)
}
