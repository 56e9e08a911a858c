package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

var (
	bt0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// errOutage, errStall and reply stand for a refused connection, a timeout
	// and an OOM reply.
	errOutage = fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
	errStall  = fmt.Errorf("read: %w", context.DeadlineExceeded)
	reply     = oomReply{}
)

// oomReply is an error reply from a live server (go-redis' Error shape).
type oomReply struct{}

func (oomReply) Error() string { return "OOM command not allowed when used memory > 'maxmemory'." }
func (oomReply) RedisError()   {}

// step is one breaker event at bt0+at: a call attempt (Allow) and, when
// allowed, its outcome (Record with err at the same instant).
type step struct {
	at        time.Duration
	err       error
	wantAllow bool
	wantState redis.BreakerState // after the step
}

func TestBreakerSteps(t *testing.T) {
	opts := redis.BreakerOptions{Failures: 3, Window: time.Second, MinCalls: 10, FailureRatio: 0.5, OpenFor: 250 * time.Millisecond}
	ms := time.Millisecond
	cases := []struct {
		name  string
		steps []step
	}{
		{"consecutive failures open, probe closes", []step{
			{0, nil, true, redis.BreakerClosed},
			{1 * ms, errOutage, true, redis.BreakerClosed},
			{2 * ms, errOutage, true, redis.BreakerClosed},
			{3 * ms, errOutage, true, redis.BreakerOpen},
			{4 * ms, nil, false, redis.BreakerOpen},
			{252 * ms, nil, false, redis.BreakerOpen},
			{253 * ms, nil, true, redis.BreakerClosed}, // half-open probe succeeds
			{254 * ms, errOutage, true, redis.BreakerClosed},
		}},
		{"failed probe reopens for another OpenFor", []step{
			{0, errOutage, true, redis.BreakerClosed},
			{0, errOutage, true, redis.BreakerClosed},
			{0, errOutage, true, redis.BreakerOpen},
			{250 * ms, errOutage, true, redis.BreakerOpen}, // probe fails
			{499 * ms, nil, false, redis.BreakerOpen},
			{500 * ms, nil, true, redis.BreakerClosed},
		}},
		{"a success resets the consecutive count", []step{
			{0, errOutage, true, redis.BreakerClosed},
			{1 * ms, errOutage, true, redis.BreakerClosed},
			{2 * ms, nil, true, redis.BreakerClosed},
			{3 * ms, errOutage, true, redis.BreakerClosed},
			{4 * ms, errOutage, true, redis.BreakerClosed},
			{5 * ms, errOutage, true, redis.BreakerOpen},
		}},
		{"replies from a live server never open", []step{
			{0, reply, true, redis.BreakerClosed},
			{1 * ms, reply, true, redis.BreakerClosed},
			{2 * ms, reply, true, redis.BreakerClosed},
			{3 * ms, reply, true, redis.BreakerClosed},
			{4 * ms, context.Canceled, true, redis.BreakerClosed},
			{5 * ms, context.Canceled, true, redis.BreakerClosed},
			{6 * ms, context.Canceled, true, redis.BreakerClosed},
		}},
		{"failure ratio over the window opens", append(alternate(9, ms), // 4 of 9 failed, never 2 in a row
			step{9 * ms, nil, true, redis.BreakerClosed},        // 4/10 < 0.5
			step{10 * ms, errOutage, true, redis.BreakerClosed}, // 5/11 < 0.5
			step{11 * ms, errOutage, true, redis.BreakerOpen},   // 6/12 >= 0.5
		)},
		{"failures older than the window are forgotten", append(alternate(9, 100*ms), // t = 0..800 ms
			// Within 1 s of 1500 ms: the calls at 600..800 ms and this one,
			// below MinCalls; counting all of them would be 5/10 and open.
			step{1500 * ms, errOutage, true, redis.BreakerClosed},
		)},
		{"a canceled probe leaves half-open for the next call", []step{
			{0, errOutage, true, redis.BreakerClosed},
			{0, errOutage, true, redis.BreakerClosed},
			{0, errOutage, true, redis.BreakerOpen},
			{300 * ms, context.Canceled, true, redis.BreakerHalfOpen},
			{301 * ms, nil, true, redis.BreakerClosed},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runSteps(t, redis.NewBreaker(opts, nil), tc.steps)
		})
	}
}

// runSteps applies steps to b in order.
func runSteps(t *testing.T, b *redis.Breaker, steps []step) {
	t.Helper()
	for i, s := range steps {
		now := bt0.Add(s.at)
		err := b.Allow(now)
		if got := err == nil; got != s.wantAllow {
			t.Fatalf("step %d (+%v): allowed = %v, want %v", i, s.at, got, s.wantAllow)
		}
		if err != nil {
			if redis.CauseOf(err) != redis.CauseCircuitOpen || !errors.Is(err, redis.ErrCircuitOpen) {
				t.Fatalf("step %d: refusal %v has cause %q", i, err, redis.CauseOf(err))
			}
		} else {
			b.Record(now, s.err)
		}
		if got := b.StateAt(now); got != s.wantState {
			t.Fatalf("step %d (+%v): state = %v, want %v", i, s.at, got, s.wantState)
		}
	}
}

// alternate is n calls every dt, failing on odd indexes.
func alternate(n int, dt time.Duration) []step {
	var s []step
	for i := 0; i < n; i++ {
		var err error
		if i%2 == 1 {
			err = errOutage
		}
		s = append(s, step{time.Duration(i) * dt, err, true, redis.BreakerClosed})
	}
	return s
}

// TestBreakerFailFor: with FailFor, neither rule opens the circuit on
// timeouts that span less than FailFor (a brief errStall), and a continuous
// errOutage opens it as soon as they do; refused connections open it at once.
func TestBreakerFailFor(t *testing.T) {
	opts := redis.BreakerOptions{Failures: 3, FailFor: 50 * time.Millisecond, Window: time.Second, MinCalls: 10, FailureRatio: 0.5, OpenFor: 250 * time.Millisecond}
	ms := time.Millisecond
	// every is n steps dt apart from `from`, all failing with err.
	every := func(from time.Duration, n int, dt time.Duration, err error, want redis.BreakerState) []step {
		var s []step
		for i := range n {
			s = append(s, step{from + time.Duration(i)*dt, err, true, want})
		}
		return s
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"50 callers timing out together on one errStall stay closed",
			append(every(10*ms, 50, 0, errStall, redis.BreakerClosed),
				step{11 * ms, nil, true, redis.BreakerClosed})},
		{"a 40 ms errStall of failures, then a success: closed",
			append(every(10*ms, 41, ms, errStall, redis.BreakerClosed), // failures at 10..50 ms: span 40 ms
				step{51 * ms, nil, true, redis.BreakerClosed})},
		{"continuous failures open once they span FailFor",
			append(every(10*ms, 50, ms, errStall, redis.BreakerClosed), // 10..59 ms: span 49 ms
				step{60 * ms, errStall, true, redis.BreakerOpen})},
		{"a success restarts the span (the ratio stays below FailureRatio)",
			append(append(append(every(0, 100, 0, nil, redis.BreakerClosed),
				every(0, 40, ms, errStall, redis.BreakerClosed)...), // 0..39 ms
				step{40 * ms, nil, true, redis.BreakerClosed}),
				append(every(41*ms, 50, ms, errStall, redis.BreakerClosed), // 41..90 ms: span 49 ms
					step{91 * ms, errStall, true, redis.BreakerOpen})...)},
		{"the ratio rule waits for FailFor too",
			append(append(alternate(40, ms), // 0..39 ms: 20 of 40 failed, never 2 in a row
				step{40 * ms, nil, true, redis.BreakerClosed}),
				step{51 * ms, errStall, true, redis.BreakerOpen})}, // first failure at 1 ms: span 50 ms, 21/42
		{"refused connections open at once (Failures), without FailFor",
			[]step{{0, errOutage, true, redis.BreakerClosed}, {1 * ms, errOutage, true, redis.BreakerClosed}, {2 * ms, errOutage, true, redis.BreakerOpen}}},
		{"a refused connection in a run of timeouts lifts FailFor",
			[]step{{0, errStall, true, redis.BreakerClosed}, {1 * ms, errStall, true, redis.BreakerClosed}, {2 * ms, errStall, true, redis.BreakerClosed},
				{3 * ms, errOutage, true, redis.BreakerOpen}}},
		{"sparse failures open once Failures of them span FailFor",
			[]step{{0, errStall, true, redis.BreakerClosed}, {100 * ms, errStall, true, redis.BreakerClosed}, {200 * ms, errStall, true, redis.BreakerOpen}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runSteps(t, redis.NewBreaker(opts, nil), tc.steps)
		})
	}
}

// TestBreakerProbes: half-open allows Probes concurrent probes; a success
// closes, and only when every probe in flight failed does it open again.
func TestBreakerProbes(t *testing.T) {
	opts := redis.BreakerOptions{Failures: 1, Window: time.Second, MinCalls: 1, FailureRatio: 1, OpenFor: 250 * time.Millisecond, Probes: 3}
	ms := time.Millisecond
	type ev struct {
		at     time.Duration
		op     string // "allow", "deny" (Allow must refuse), "ok", "fail", "cancel" (Record)
		want   redis.BreakerState
		opened uint64
	}
	cases := []struct {
		name string
		evs  []ev
	}{
		{"three probes, the fourth refused, one success closes", []ev{
			{0, "allow", redis.BreakerClosed, 0}, {0, "fail", redis.BreakerOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{251 * ms, "allow", redis.BreakerHalfOpen, 1},
			{252 * ms, "deny", redis.BreakerHalfOpen, 1},
			{253 * ms, "fail", redis.BreakerHalfOpen, 1},  // two probes still in flight
			{254 * ms, "allow", redis.BreakerHalfOpen, 1}, // a freed probe slot
			{255 * ms, "ok", redis.BreakerClosed, 1},
			{256 * ms, "fail", redis.BreakerOpen, 2}, // a late probe counts as a normal call (Failures 1, FailFor 0)
		}},
		{"every probe failing reopens", []ev{
			{0, "allow", redis.BreakerClosed, 0}, {0, "fail", redis.BreakerOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{260 * ms, "fail", redis.BreakerHalfOpen, 1},
			{261 * ms, "cancel", redis.BreakerHalfOpen, 1}, // canceled: neither
			{262 * ms, "allow", redis.BreakerHalfOpen, 1},
			{263 * ms, "fail", redis.BreakerOpen, 2}, // the last probe in flight failed
			{264 * ms, "deny", redis.BreakerOpen, 2},
			{513 * ms, "allow", redis.BreakerHalfOpen, 2},
			{514 * ms, "ok", redis.BreakerClosed, 2},
		}},
		{"lost probes are replaced after OpenFor", []ev{
			{0, "allow", redis.BreakerClosed, 0}, {0, "fail", redis.BreakerOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{250 * ms, "allow", redis.BreakerHalfOpen, 1},
			{499 * ms, "deny", redis.BreakerHalfOpen, 1},
			{500 * ms, "allow", redis.BreakerHalfOpen, 1},
			{500 * ms, "ok", redis.BreakerClosed, 1},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := redis.NewBreaker(opts, nil)
			for i, e := range tc.evs {
				now := bt0.Add(e.at)
				switch e.op {
				case "allow", "deny":
					err := b.Allow(now)
					if (err == nil) != (e.op == "allow") {
						t.Fatalf("event %d (+%v %s): Allow = %v", i, e.at, e.op, err)
					}
				case "ok":
					b.Record(now, nil)
				case "fail":
					b.Record(now, errOutage)
				case "cancel":
					b.Record(now, context.Canceled)
				}
				if got := b.StateAt(now); got != e.want {
					t.Fatalf("event %d (+%v %s): state %v, want %v", i, e.at, e.op, got, e.want)
				}
				if got := b.Opened(); got != e.opened {
					t.Fatalf("event %d (+%v %s): opened %d times, want %d", i, e.at, e.op, got, e.opened)
				}
			}
		})
	}
}

// TestBreakerDefaults: with DefaultBreakerOptions a frozen Redis timing
// out a call every 1 ms opens the circuit 50 ms after the first failure, and the
// half-open state admits DefaultBreakerProbes probes.
func TestBreakerDefaults(t *testing.T) {
	opts := redis.DefaultBreakerOptions()
	b := redis.NewBreaker(opts, nil)
	var at time.Duration
	for ; b.StateAt(bt0.Add(at)) == redis.BreakerClosed; at += time.Millisecond {
		if at > time.Second {
			t.Fatal("never opened")
		}
		if err := b.Allow(bt0.Add(at)); err != nil {
			t.Fatal(err)
		}
		b.Record(bt0.Add(at), errStall)
	}
	if opened := at - time.Millisecond; opened != opts.FailFor {
		t.Fatalf("opened %v after the first failure, want %v", opened, opts.FailFor)
	}
	half := bt0.Add(at + opts.OpenFor)
	if got := b.StateAt(half); got != redis.BreakerHalfOpen || got.String() != "half_open" {
		t.Fatalf("state at +OpenFor = %v", got)
	}
	for i := range opts.Probes {
		if err := b.Allow(half); err != nil {
			t.Fatalf("probe %d refused: %v", i+1, err)
		}
	}
	// Timeouts alone opened it: a refused call gets ErrStalledOpen (the
	// stall is established: failure modes, cause stalled).
	if err := b.Allow(half); !errors.Is(err, redis.ErrStalledOpen) {
		t.Fatalf("probe %d: %v, want ErrStalledOpen", opts.Probes+1, err)
	}
}

// TestBreakerOpenErrTellsProof: a circuit opened by a proven failure
// (refused) refuses calls with ErrCircuitOpen, one opened by timeouts only
// with ErrStalledOpen (cause stalled); OpenErr says the same while open
// and nil otherwise.
func TestBreakerOpenErrTellsProof(t *testing.T) {
	opts := redis.BreakerOptions{Failures: 1, Window: time.Second, MinCalls: 1, FailureRatio: 1, OpenFor: time.Second}
	for _, tc := range []struct {
		name string
		fail error
		want error
	}{
		{"refused", errOutage, redis.ErrCircuitOpen},
		{"timeout", context.DeadlineExceeded, redis.ErrStalledOpen},
	} {
		b := redis.NewBreaker(opts, nil)
		if err := b.OpenErr(bt0); err != nil {
			t.Fatalf("%s: OpenErr of a closed breaker: %v", tc.name, err)
		}
		if err := b.Allow(bt0); err != nil {
			t.Fatal(err)
		}
		b.Record(bt0, tc.fail)
		if err := b.Allow(bt0); err != tc.want {
			t.Errorf("%s: Allow after the opening failure: %v, want %v", tc.name, err, tc.want)
		}
		if err := b.OpenErr(bt0); err != tc.want {
			t.Errorf("%s: OpenErr: %v, want %v", tc.name, err, tc.want)
		}
		if err := b.OpenErr(bt0.Add(time.Second)); err != nil {
			t.Errorf("%s: OpenErr once half-open: %v", tc.name, err)
		}
	}
	if redis.CauseOf(redis.ErrStalledOpen) != redis.CauseStalled {
		t.Errorf("ErrStalledOpen cause %q, want stalled", redis.CauseOf(redis.ErrStalledOpen))
	}
}

func TestBreakerDisabled(t *testing.T) {
	b := redis.NewBreaker(redis.BreakerOptions{Disabled: true}, nil)
	for i := 0; i < 100; i++ {
		if err := b.Allow(bt0); err != nil {
			t.Fatal(err)
		}
		b.Record(bt0, errOutage)
	}
	if !b.Healthy() {
		t.Fatal("disabled breaker unhealthy")
	}
}

func TestBreakerDo(t *testing.T) {
	now := bt0
	b := redis.NewBreaker(redis.BreakerOptions{Failures: 1, Window: time.Second, MinCalls: 1, FailureRatio: 1, OpenFor: time.Second},
		func() time.Time { return now })
	calls := 0
	err := b.Do(context.Background(), 5*time.Millisecond, func(ctx context.Context) error {
		calls++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("Do did not bound the context")
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if redis.CauseOf(err) != redis.CauseTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v (cause %q), want a timeout", err, redis.CauseOf(err))
	}
	if b.Healthy() {
		t.Fatal("healthy after an opening failure")
	}
	err = b.Do(context.Background(), time.Millisecond, func(context.Context) error { calls++; return nil })
	if !errors.Is(err, redis.ErrStalledOpen) || calls != 1 {
		t.Fatalf("open breaker: err %v, calls %d", err, calls)
	}
	now = now.Add(time.Second)
	if err := b.Do(context.Background(), time.Millisecond, func(context.Context) error { calls++; return nil }); err != nil {
		t.Fatal(err)
	}
	if !b.Healthy() || b.State() != redis.BreakerClosed {
		t.Fatalf("after probe: %v", b.State())
	}
}

func TestBreakerOptionsValidate(t *testing.T) {
	if err := redis.DefaultBreakerOptions().Validate(); err != nil {
		t.Fatal(err)
	}
	err := redis.BreakerOptions{FailureRatio: 2, FailFor: -1, Probes: -1}.Validate()
	for _, want := range []string{"failures", "window", "min calls", "ratio", "open-for", "fail-for", "probes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want mention of %q", err, want)
		}
	}
}

// OnTransition reports every state change once, in order, outside the
// breaker's lock (the callback may read the state).
func TestBreakerOnTransition(t *testing.T) {
	var got []string
	var b *redis.Breaker
	opts := redis.BreakerOptions{Failures: 2, Window: time.Second, MinCalls: 10, FailureRatio: 0.5, OpenFor: 100 * time.Millisecond,
		OnTransition: func(to redis.BreakerState) {
			got = append(got, to.String()+"/"+b.StateAt(bt0.Add(time.Hour)).String())
		}}
	b = redis.NewBreaker(opts, nil)
	ms := time.Millisecond
	call := func(at time.Duration, err error) {
		if b.Allow(bt0.Add(at)) == nil {
			b.Record(bt0.Add(at), err)
		}
	}
	call(0, nil)
	call(1*ms, errOutage)
	call(2*ms, errOutage) // opens
	call(3*ms, nil)       // refused: open
	call(110*ms, errOutage)
	call(220*ms, nil) // half-open probe succeeds: closed
	call(230*ms, nil)
	want := []string{"open/half_open", "half_open/half_open", "open/half_open", "half_open/half_open", "closed/closed"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("transitions %v, want %v", got, want)
	}
	if b.Opened() != 2 {
		t.Errorf("opened %d times, want 2", b.Opened())
	}
}
