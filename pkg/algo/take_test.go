package algo

import (
	"math/rand"
	"testing"
	"time"
)

// base is an instant aligned to every epoch-aligned unit up to a day.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type step struct {
	at      time.Duration // offset from base (or an absolute instant when abs is set)
	abs     time.Time
	cost    int64
	release bool
	want    Decision
}

func ok(rem int64, reset, window time.Duration) Decision {
	return Decision{Allowed: true, Remaining: rem, ResetAfter: reset, WindowAfter: window}
}

func deny(rem int64, retry, reset, window time.Duration) Decision {
	return Decision{Remaining: rem, RetryAfter: retry, ResetAfter: reset, WindowAfter: window}
}

func runSteps(t *testing.T, l Limit, steps []step) {
	t.Helper()
	var s State
	for i, st := range steps {
		now := base.Add(st.at)
		if !st.abs.IsZero() {
			now = st.abs
		}
		prev := s
		var d Decision
		s, d = Apply(s, Hit{Limit: l, Cost: st.cost, Release: st.release}, now)
		if d != st.want {
			t.Fatalf("step %d (at %v cost %d release %v):\n got %+v\nwant %+v", i, st.at, st.cost, st.release, d, st.want)
		}
		if (!d.Allowed || st.cost == 0) && !equalState(prev, s) {
			t.Fatalf("step %d: denied or check-only hit changed the state: %+v -> %+v", i, prev, s)
		}
	}
}

func equalState(a, b State) bool {
	if a.Time != b.Time || a.Count != b.Count || a.Prev != b.Prev || len(a.Log) != len(b.Log) {
		return false
	}
	for i := range a.Log {
		if a.Log[i] != b.Log[i] {
			return false
		}
	}
	return true
}

const s1 = time.Second

func TestFixedWindow(t *testing.T) {
	l := Limit{Kind: FixedWindow, Rate: 3, Period: time.Minute}
	runSteps(t, l, []step{
		{at: 0, cost: 1, want: ok(2, 60*s1, 60*s1)},
		{at: 1 * s1, cost: 1, want: ok(1, 59*s1, 59*s1)},
		{at: 2 * s1, cost: 1, want: ok(0, 58*s1, 58*s1)},
		{at: 3 * s1, cost: 1, want: deny(0, 57*s1, 57*s1, 57*s1)},
		{at: 3 * s1, cost: 0, want: deny(0, 57*s1, 57*s1, 57*s1)},
		{at: 60 * s1, cost: 1, want: ok(2, 60*s1, 60*s1)},
		{at: 61 * s1, cost: 3, want: deny(2, 59*s1, 59*s1, 59*s1)},
		{at: 61 * s1, cost: 4, want: deny(2, 59*s1, 59*s1, 59*s1)},
		{at: 61 * s1, cost: 0, want: ok(2, 59*s1, 59*s1)},
		// clock back into the previous window: the later window's count holds
		{at: 50 * s1, cost: 2, want: ok(0, 70*s1, 70*s1)},
		{at: 55 * s1, cost: 1, want: deny(0, 65*s1, 65*s1, 65*s1)},
		{at: 119 * s1, cost: 1, want: deny(0, s1, s1, s1)},
		// long idle
		{at: 10 * time.Hour, cost: 3, want: ok(0, 60*s1, 60*s1)},
	})
}

func TestFixedWindowMultiplier(t *testing.T) {
	// 2 per 10 seconds (unit second, unit_multiplier 10): windows start at multiples of 10 s.
	l := Limit{Kind: FixedWindow, Rate: 2, Period: 10 * s1}
	runSteps(t, l, []step{
		{at: 7 * s1, cost: 2, want: ok(0, 3*s1, 3*s1)},
		{at: 9 * s1, cost: 1, want: deny(0, s1, s1, s1)},
		{at: 10 * s1, cost: 1, want: ok(1, 10*s1, 10*s1)},
	})
}

func TestRateZeroDeniesEverything(t *testing.T) {
	for _, k := range []Kind{FixedWindow, SlidingWindow, SlidingLog, TokenBucket, Concurrency} {
		l := Limit{Kind: k, Rate: 0, Period: time.Minute}
		w := time.Minute
		if k == FixedWindow || k == SlidingWindow {
			w = 50 * s1
		}
		runSteps(t, l, []step{
			{at: 10 * s1, cost: 1, want: deny(0, w, w, w)},
			{at: 10 * s1, cost: 0, want: deny(0, w, w, w)},
		})
	}
}

func TestTokenBucket(t *testing.T) {
	// 1 per second, burst 3.
	l := Limit{Kind: TokenBucket, Rate: 1, Period: s1, Burst: 3}
	ms := time.Millisecond
	runSteps(t, l, []step{
		{at: 0, cost: 0, want: ok(3, 0, s1)},
		{at: 0, cost: 1, want: ok(2, s1, s1)},
		{at: 0, cost: 2, want: ok(0, 3*s1, s1)},
		{at: 0, cost: 1, want: deny(0, s1, 3*s1, s1)},
		{at: 0, cost: 0, want: deny(0, s1, 3*s1, s1)},
		{at: 500 * ms, cost: 1, want: deny(0, 500*ms, 2500*ms, 500*ms)},
		{at: 500 * ms, cost: 4, want: deny(0, s1, 2500*ms, 500*ms)}, // above capacity: never
		{at: 1 * s1, cost: 1, want: ok(0, 3*s1, s1)},
		{at: 2500 * ms, cost: 2, want: deny(1, 500*ms, 1500*ms, 500*ms)},
		{at: 2500 * ms, cost: 1, want: ok(0, 2500*ms, 500*ms)},
		// clock back: TAT holds, nothing extra
		{at: 1 * s1, cost: 1, want: deny(0, 2*s1, 4*s1, 2*s1)},
		// long idle: full again, capacity caps the refill
		{at: time.Hour, cost: 3, want: ok(0, 3*s1, s1)},
		{at: time.Hour, cost: 1, want: deny(0, s1, 3*s1, s1)},
	})
}

func TestTokenBucketFractionalEmission(t *testing.T) {
	// 3 per second, burst 3: T = 333333 1/3 µs; three at once then exact spacing.
	l := Limit{Kind: TokenBucket, Rate: 3, Period: s1}
	us := time.Microsecond
	runSteps(t, l, []step{
		{at: 0, cost: 3, want: ok(0, s1, 333334*us)},
		{at: 0, cost: 1, want: deny(0, 333334*us, s1, 333334*us)},
		{at: 333333 * us, cost: 1, want: deny(0, 1*us, 666667*us, 1*us)},
		{at: 333334 * us, cost: 1, want: ok(0, s1, 333333*us)},
		// at 1 s two tokens are back (TAT = 1333333 1/3 µs); taking 1 leaves
		// TAT = 1666666 2/3 µs, taking 1 more makes it exactly 2 s
		{at: s1, cost: 1, want: ok(1, 666667*us, 333334*us)},
		{at: s1, cost: 1, want: ok(0, s1, 333334*us)},
		{at: s1, cost: 1, want: deny(0, 333334*us, s1, 333334*us)},
	})
}

func TestSlidingWindow(t *testing.T) {
	l := Limit{Kind: SlidingWindow, Rate: 10, Period: time.Minute}
	runSteps(t, l, []step{
		{at: 30 * s1, cost: 10, want: ok(0, 90*s1, 36*s1)},
		{at: 30 * s1, cost: 1, want: deny(0, 36*s1, 90*s1, 36*s1)},
		{at: 30 * s1, cost: 0, want: deny(0, 36*s1, 90*s1, 36*s1)},
		// next window: prev 10 weighs 1 at its start, 0.9 after 6 s
		{at: 60 * s1, cost: 1, want: deny(0, 6*s1, 60*s1, 6*s1)},
		{at: 66 * s1, cost: 1, want: ok(0, 114*s1, 6*s1)},
		// at 90 s: est = 10*0.5 + 1 = 6
		{at: 90 * s1, cost: 0, want: ok(4, 90*s1, 6*s1)},
		{at: 90 * s1, cost: 5, want: deny(4, 6*s1, 90*s1, 6*s1)},
		{at: 90 * s1, cost: 11, want: deny(4, 30*s1, 90*s1, 6*s1)}, // above capacity
		{at: 90 * s1, cost: 4, want: ok(0, 90*s1, 6*s1)},
		// clock back into the first window: treated as the start of the stored one (weight 1)
		{at: 59 * s1, cost: 1, want: deny(0, 37*s1, 121*s1, 37*s1)},
		// long idle
		{at: time.Hour, cost: 10, want: ok(0, 120*s1, 66*s1)},
	})
}

func TestSlidingLog(t *testing.T) {
	l := Limit{Kind: SlidingLog, Rate: 3, Period: 10 * s1}
	runSteps(t, l, []step{
		{at: 0, cost: 1, want: ok(2, 10*s1, 10*s1)},
		{at: 1 * s1, cost: 1, want: ok(1, 10*s1, 9*s1)},
		{at: 2 * s1, cost: 1, want: ok(0, 10*s1, 8*s1)},
		{at: 5 * s1, cost: 1, want: deny(0, 5*s1, 7*s1, 5*s1)},
		{at: 5 * s1, cost: 0, want: deny(0, 5*s1, 7*s1, 5*s1)},
		{at: 10 * s1, cost: 1, want: ok(0, 10*s1, s1)},
		{at: 10 * s1, cost: 2, want: deny(0, 2*s1, 10*s1, s1)},
		{at: 11 * s1, cost: 4, want: deny(1, 10*s1, 9*s1, s1)},
		{at: 11 * s1, cost: 0, want: ok(1, 9*s1, s1)},
		// clock back: entries in the future still count
		{at: 3 * s1, cost: 1, want: deny(0, 8*s1, 17*s1, 8*s1)},
		{at: time.Hour, cost: 3, want: ok(0, 10*s1, 10*s1)},
	})
}

func TestConcurrency(t *testing.T) {
	l := Limit{Kind: Concurrency, Rate: 2, Period: 30 * s1}
	runSteps(t, l, []step{
		{at: 0, cost: 1, want: ok(1, 30*s1, 30*s1)},
		{at: 1 * s1, cost: 1, want: ok(0, 30*s1, 29*s1)},
		{at: 2 * s1, cost: 1, want: deny(0, 28*s1, 29*s1, 28*s1)},
		{at: 3 * s1, cost: 1, release: true, want: ok(1, 28*s1, 28*s1)},
		{at: 4 * s1, cost: 1, want: ok(0, 30*s1, 27*s1)},
		{at: 5 * s1, cost: 3, want: deny(0, 30*s1, 29*s1, 26*s1)}, // above capacity
		{at: 5 * s1, cost: 5, release: true, want: ok(2, 0, 30*s1)},
		{at: 6 * s1, cost: 2, want: ok(0, 30*s1, 30*s1)},
		// without release the leases expire after Period
		{at: 36 * s1, cost: 0, want: ok(2, 0, 30*s1)},
		{at: 36 * s1, cost: 1, release: true, want: ok(2, 0, 30*s1)},
	})
}

func TestCalendarFixedWindow(t *testing.T) {
	l := Limit{Kind: FixedWindow, Rate: 2, Calendar: CalendarMonth, Multiplier: 1, Period: 30 * 24 * time.Hour}
	endJan := time.Date(2026, 1, 31, 23, 59, 59, 0, time.UTC)
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	runSteps(t, l, []step{
		{abs: endJan, cost: 2, want: ok(0, s1, s1)},
		{abs: endJan, cost: 1, want: deny(0, s1, s1, s1)},
		{abs: feb, cost: 1, want: ok(1, 28*day, 28*day)},
	})
	y := Limit{Kind: FixedWindow, Rate: 1, Calendar: CalendarYear, Multiplier: 2, Period: 365 * day}
	mid := time.Date(2027, 7, 1, 0, 0, 0, 0, time.UTC)
	runSteps(t, y, []step{
		{abs: mid, cost: 1, want: ok(0, 184*day, 184*day)},
		{abs: mid.Add(100 * day), cost: 1, want: deny(0, 84*day, 84*day, 84*day)},
		{abs: time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC), cost: 1, want: ok(0, 731*day, 731*day)},
	})
}

func TestWindowBoundsCalendar(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for range 20000 {
		at := time.UnixMicro(r.Int63n(200*365*86400*1e6) - 30*365*86400*1e6).UTC()
		mult := int64(1 + r.Intn(13))
		for _, cal := range []Calendar{CalendarMonth, CalendarYear} {
			start, end := WindowBoundsUs(Limit{Calendar: cal, Multiplier: mult}, at.UnixMicro())
			var ws, we time.Time
			if cal == CalendarMonth {
				mi := int64(at.Year()-1970)*12 + int64(at.Month()-1)
				k := floorDiv(mi, mult) * mult
				ws = time.Date(1970, time.Month(k+1), 1, 0, 0, 0, 0, time.UTC)
				we = time.Date(1970, time.Month(k+mult+1), 1, 0, 0, 0, 0, time.UTC)
			} else {
				k := floorDiv(int64(at.Year()-1970), mult) * mult
				ws = time.Date(int(1970+k), 1, 1, 0, 0, 0, 0, time.UTC)
				we = time.Date(int(1970+k+mult), 1, 1, 0, 0, 0, 0, time.UTC)
			}
			if start != ws.UnixMicro() || end != we.UnixMicro() {
				t.Fatalf("%v cal %d mult %d: got [%v, %v) want [%v, %v)", at, cal, mult,
					time.UnixMicro(start).UTC(), time.UnixMicro(end).UTC(), ws, we)
			}
		}
	}
}

// TestFractionalRefill: a client retrying every 10 ms against 1 per second
// gets exactly one admission per second, for every algorithm.
func TestFractionalRefill(t *testing.T) {
	for _, k := range []Kind{FixedWindow, SlidingWindow, SlidingLog, TokenBucket} {
		l := Limit{Kind: k, Rate: 1, Period: s1}
		var s State
		var admitted []time.Duration
		for at := time.Duration(0); at < 10*s1; at += 10 * time.Millisecond {
			var d Decision
			s, d = Take(l, s, base.Add(at), 1)
			if d.Allowed {
				admitted = append(admitted, at)
			}
		}
		// sliding window: an admission at x within a window keeps prev
		// weight > 0 until x+P; admissions are one per second or slower.
		if k == SlidingWindow {
			if len(admitted) < 5 || len(admitted) > 10 {
				t.Fatalf("%v: %d admissions in 10 s: %v", k, len(admitted), admitted)
			}
			for i := 1; i < len(admitted); i++ {
				if admitted[i]-admitted[i-1] < s1 {
					t.Fatalf("%v: admissions %v apart", k, admitted[i]-admitted[i-1])
				}
			}
			continue
		}
		if len(admitted) != 10 {
			t.Fatalf("%v: %d admissions in 10 s, want 10: %v", k, len(admitted), admitted)
		}
		for i, at := range admitted {
			if at != time.Duration(i)*s1 {
				t.Fatalf("%v: admission %d at %v, want %v", k, i, at, time.Duration(i)*s1)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	good := []Limit{
		{Kind: FixedWindow, Rate: 10, Period: s1},
		{Kind: FixedWindow, Rate: 0, Period: s1},
		{Kind: TokenBucket, Rate: 1_000_000, Period: time.Hour, Burst: 2_000_000},
		{Kind: SlidingLog, Rate: MaxSlidingLogRate, Period: time.Hour},
		{Kind: SlidingWindow, Rate: 5, Period: 30 * 24 * time.Hour, Calendar: CalendarMonth, Multiplier: 3},
		{Kind: FixedWindow, Rate: MaxCost - 1, Period: s1},
		{Kind: TokenBucket, Rate: 1, Period: time.Microsecond, Burst: MaxCost - 1},
	}
	for _, l := range good {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	bad := []Limit{
		{Kind: FixedWindow, Rate: -1, Period: s1},
		{Kind: FixedWindow, Rate: 1, Period: 0},
		{Kind: FixedWindow, Rate: 1, Period: 1500 * time.Nanosecond},
		{Kind: TokenBucket, Rate: 1, Period: s1, Burst: -1},
		{Kind: TokenBucket, Rate: 1_000_000, Period: 24 * time.Hour},
		{Kind: SlidingLog, Rate: MaxSlidingLogRate + 1, Period: s1},
		{Kind: TokenBucket, Rate: 1, Period: s1, Calendar: CalendarMonth, Multiplier: 1},
		{Kind: FixedWindow, Rate: 1, Period: s1, Calendar: CalendarYear},
		{Kind: Concurrency + 1, Rate: 1, Period: s1},
		{Kind: FixedWindow, Rate: MaxCost, Period: s1},
		// capacity × period and capacity × rate are 2^53, but the
		// capacity must stay below MaxCost
		{Kind: TokenBucket, Rate: 1, Period: time.Microsecond, Burst: MaxCost},
	}
	for _, l := range bad {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: no error", l)
		}
	}
}

func TestExpiresAt(t *testing.T) {
	l := Limit{Kind: TokenBucket, Rate: 1, Period: s1, Burst: 2}
	s, _ := Take(l, State{}, base, 2)
	if got := ExpiresAt(l, s); !got.Equal(base.Add(2 * s1)) {
		t.Fatalf("token bucket expiry %v", got)
	}
	s2, d := Take(l, State{}, base.Add(2*s1), 2)
	if !d.Allowed || !ExpiresAt(l, State{}).IsZero() {
		t.Fatalf("zero state must be empty and full after expiry: %+v", d)
	}
	_ = s2
	f := Limit{Kind: SlidingWindow, Rate: 5, Period: time.Minute}
	s, _ = Take(f, State{}, base.Add(10*s1), 1)
	if got := ExpiresAt(f, s); !got.Equal(base.Add(2 * time.Minute)) {
		t.Fatalf("sliding window expiry %v", got)
	}
}

// TestChargeExtremeDebtDurations: a token bucket whose capacity spans
// 2^53 µs charged into one capacity of debt is further away than a
// time.Duration reaches: its durations saturate instead of wrapping
// negative.
func TestChargeExtremeDebtDurations(t *testing.T) {
	l := Limit{Kind: TokenBucket, Rate: 1, Period: 2 * time.Microsecond, Burst: 1 << 52}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st, d := Charge(l, State{}, now, MaxCost)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.ResetAfter <= 0 || d.WindowAfter <= 0 {
		t.Fatalf("charge: %+v", d)
	}
	if _, d := Charge(l, st, now, MaxCost); d.ResetAfter != MicrosDuration(1<<62) || d.ResetAfter <= 0 {
		t.Fatalf("second charge: %+v, want saturated durations", d)
	}
}
