package breaker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// The backend-independent part: which refusal a circuit gives by the
// Outcome that opened it, and OutcomeOf. The state machine's tables are
// in pkg/backend/redis (breaker_test.go), through Redis' errors.
var (
	errOpen    = errors.New("open")
	errStalled = errors.New("stalled open")
	errRefused = errors.New("refused")
	errSlow    = errors.New("slow")
	errGone    = errors.New("caller gone")
)

func outcome(err error) breaker.Outcome {
	switch err {
	case errRefused:
		return breaker.Failed
	case errSlow:
		return breaker.Stalled
	case errGone, errOpen, errStalled:
		return breaker.Neutral
	}
	return breaker.Answered
}

func TestRefusalFollowsTheOpeningOutcome(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := breaker.Options{Failures: 2, Window: time.Second, MinCalls: 100, FailureRatio: 1, OpenFor: time.Second}
	errs := breaker.Errors{Open: errOpen, StalledOpen: errStalled, Outcome: outcome}
	for _, c := range []struct {
		name  string
		calls []error
		want  error // of the next Allow
	}{
		{"proven failures", []error{errRefused, errRefused}, errOpen},
		{"stalls alone", []error{errSlow, errSlow}, errStalled},
		{"a stall, then a proven failure", []error{errSlow, errRefused}, errOpen},
		{"neutral outcomes count for nothing", []error{errRefused, errGone, errGone}, nil},
		{"an answer resets the run", []error{errRefused, errors.New("reply"), errRefused}, nil},
	} {
		b := breaker.New(o, errs, nil)
		for i, err := range c.calls {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			if e := b.Allow(at); e != nil {
				t.Fatalf("%s: call %d refused: %v", c.name, i, e)
			}
			b.Record(at, err)
		}
		if got := b.Allow(t0.Add(10 * time.Millisecond)); got != c.want {
			t.Errorf("%s: Allow after the calls = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		outage, timeout, neutral bool
		want                     breaker.Outcome
	}{
		{false, false, false, breaker.Answered},
		{false, true, false, breaker.Answered},
		{true, true, false, breaker.Stalled},
		{true, false, false, breaker.Failed},
		{true, true, true, breaker.Neutral},
		{true, false, true, breaker.Neutral},
	} {
		if got := breaker.OutcomeOf(c.outage, c.timeout, c.neutral); got != c.want {
			t.Errorf("OutcomeOf(outage %v, timeout %v, neutral %v) = %v, want %v", c.outage, c.timeout, c.neutral, got, c.want)
		}
	}
}
