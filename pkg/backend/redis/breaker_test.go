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
	// outage and reply stand for a refused connection and an OOM reply.
	outage = fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
	reply  = oomReply{}
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
			{1 * ms, outage, true, redis.BreakerClosed},
			{2 * ms, outage, true, redis.BreakerClosed},
			{3 * ms, outage, true, redis.BreakerOpen},
			{4 * ms, nil, false, redis.BreakerOpen},
			{252 * ms, nil, false, redis.BreakerOpen},
			{253 * ms, nil, true, redis.BreakerClosed}, // half-open probe succeeds
			{254 * ms, outage, true, redis.BreakerClosed},
		}},
		{"failed probe reopens for another OpenFor", []step{
			{0, outage, true, redis.BreakerClosed},
			{0, outage, true, redis.BreakerClosed},
			{0, outage, true, redis.BreakerOpen},
			{250 * ms, outage, true, redis.BreakerOpen}, // probe fails
			{499 * ms, nil, false, redis.BreakerOpen},
			{500 * ms, nil, true, redis.BreakerClosed},
		}},
		{"a success resets the consecutive count", []step{
			{0, outage, true, redis.BreakerClosed},
			{1 * ms, outage, true, redis.BreakerClosed},
			{2 * ms, nil, true, redis.BreakerClosed},
			{3 * ms, outage, true, redis.BreakerClosed},
			{4 * ms, outage, true, redis.BreakerClosed},
			{5 * ms, outage, true, redis.BreakerOpen},
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
			step{9 * ms, nil, true, redis.BreakerClosed},     // 4/10 < 0.5
			step{10 * ms, outage, true, redis.BreakerClosed}, // 5/11 < 0.5
			step{11 * ms, outage, true, redis.BreakerOpen},   // 6/12 >= 0.5
		)},
		{"failures older than the window are forgotten", append(alternate(9, 100*ms), // t = 0..800 ms
			// Within 1 s of 1500 ms: the calls at 600..800 ms and this one,
			// below MinCalls; counting all of them would be 5/10 and open.
			step{1500 * ms, outage, true, redis.BreakerClosed},
		)},
		{"a canceled probe leaves half-open for the next call", []step{
			{0, outage, true, redis.BreakerClosed},
			{0, outage, true, redis.BreakerClosed},
			{0, outage, true, redis.BreakerOpen},
			{300 * ms, context.Canceled, true, redis.BreakerHalfOpen},
			{301 * ms, nil, true, redis.BreakerClosed},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := redis.NewBreaker(opts, nil)
			for i, s := range tc.steps {
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
		})
	}
}

// alternate is n calls every dt, failing on odd indexes.
func alternate(n int, dt time.Duration) []step {
	var s []step
	for i := 0; i < n; i++ {
		var err error
		if i%2 == 1 {
			err = outage
		}
		s = append(s, step{time.Duration(i) * dt, err, true, redis.BreakerClosed})
	}
	return s
}

func TestBreakerHalfOpenAllowsOneProbe(t *testing.T) {
	opts := redis.DefaultBreakerOptions()
	b := redis.NewBreaker(opts, nil)
	for i := 0; i < opts.Failures; i++ {
		if err := b.Allow(bt0); err != nil {
			t.Fatal(err)
		}
		b.Record(bt0, outage)
	}
	if got := b.StateAt(bt0); got != redis.BreakerOpen {
		t.Fatalf("state %v", got)
	}
	half := bt0.Add(opts.OpenFor)
	if got := b.StateAt(half); got != redis.BreakerHalfOpen || got.String() != "half_open" {
		t.Fatalf("state at +OpenFor = %v", got)
	}
	if err := b.Allow(half); err != nil {
		t.Fatalf("probe refused: %v", err)
	}
	// The probe is in flight: everyone else fails fast.
	for i := 0; i < 3; i++ {
		if err := b.Allow(half.Add(time.Millisecond)); !errors.Is(err, redis.ErrCircuitOpen) {
			t.Fatalf("second caller during probe: %v", err)
		}
	}
	// A probe that never reports is replaced after another OpenFor.
	if err := b.Allow(half.Add(opts.OpenFor)); err != nil {
		t.Fatalf("replacement probe refused: %v", err)
	}
	b.Record(half.Add(opts.OpenFor), nil)
	if got := b.StateAt(half.Add(opts.OpenFor)); got != redis.BreakerClosed {
		t.Fatalf("after probe success: %v", got)
	}
	if b.Opened() != 1 {
		t.Fatalf("Opened = %d", b.Opened())
	}
}

func TestBreakerDisabled(t *testing.T) {
	b := redis.NewBreaker(redis.BreakerOptions{Disabled: true}, nil)
	for i := 0; i < 100; i++ {
		if err := b.Allow(bt0); err != nil {
			t.Fatal(err)
		}
		b.Record(bt0, outage)
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
	if !errors.Is(err, redis.ErrCircuitOpen) || calls != 1 {
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
	err := redis.BreakerOptions{FailureRatio: 2}.Validate()
	for _, want := range []string{"failures", "window", "min calls", "ratio", "open-for"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want mention of %q", err, want)
		}
	}
}
