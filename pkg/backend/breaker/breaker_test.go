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

// TestReportsOncePerOutage: a backend down for 10 minutes, probed every
// OpenFor (each failed probe opens the circuit again: OnTransition sees
// every one), is reported once when the circuit opens, once per
// ReportEvery while it stays open (with the failed probes so far), and
// once when a probe succeeds (with all the failed probes); a second
// outage starts its own count.
func TestReportsOncePerOutage(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var reps []breaker.Report
	transitions := 0
	o := breaker.Options{Failures: 1, Window: time.Second, MinCalls: 100, FailureRatio: 1, OpenFor: 300 * time.Millisecond,
		ReportEvery: time.Minute, OnReport: func(r breaker.Report) { reps = append(reps, r) }, OnTransition: func(breaker.State) { transitions++ }}
	b := breaker.New(o, breaker.Errors{Open: errOpen, StalledOpen: errStalled, Outcome: outcome}, nil)
	now := t0
	fail := func() {
		if err := b.Allow(now); err != nil {
			t.Fatalf("at %v: %v", now.Sub(t0), err)
		}
		b.Record(now, errRefused)
	}
	for round := range 2 {
		reps, transitions = nil, 0
		start := now
		fail() // opens
		probes := 0
		for now.Sub(start) < 10*time.Minute {
			now = now.Add(o.OpenFor)
			fail() // a failed half-open probe: open again
			probes++
		}
		now = now.Add(o.OpenFor)
		if err := b.Allow(now); err != nil {
			t.Fatal(err)
		}
		b.Record(now, nil) // closes
		if transitions < 2*probes {
			t.Fatalf("round %d: %d transitions for %d failed probes: OnTransition must see each", round, transitions, probes)
		}
		if len(reps) < 3 || len(reps) > 12 {
			t.Fatalf("round %d: %d reports over 10 minutes with ReportEvery 1m, want 1 opened + 9 or 10 still open + 1 closed: %+v", round, len(reps), reps)
		}
		first, last := reps[0], reps[len(reps)-1]
		if first.To != breaker.Open || first.Still || !first.Since.Equal(start) {
			t.Errorf("round %d: first report %+v, want opened at the start", round, first)
		}
		if last.To != breaker.Closed || last.FailedProbes != probes || !last.Since.Equal(start) {
			t.Errorf("round %d: last report %+v, want closed after %d failed probes", round, last, probes)
		}
		prev := first
		for _, r := range reps[1 : len(reps)-1] {
			if r.To != breaker.Open || !r.Still || r.FailedProbes <= prev.FailedProbes {
				t.Errorf("round %d: report %+v after %+v, want still open with more failed probes", round, r, prev)
			}
			prev = r
		}
		now = now.Add(time.Hour)
	}
}

// TestReportSaysWhatOpened: the report of a circuit opening carries the
// error of the failure that opened it (nil for an unanswered invocation,
// Overdue) and whether stalls alone did; a failed probe's report carries
// the probe's error.
func TestReportSaysWhatOpened(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		fail    func(b *breaker.Breaker, now time.Time)
		err     error
		stalled bool
	}{
		{"refused", func(b *breaker.Breaker, now time.Time) { b.Record(now, errRefused) }, errRefused, false},
		{"timeouts", func(b *breaker.Breaker, now time.Time) { b.Record(now, errSlow) }, errSlow, true},
		{"unanswered", func(b *breaker.Breaker, now time.Time) { b.Overdue(now.Add(-time.Second), now) }, nil, true},
	} {
		var reports []breaker.Report
		o := breaker.Options{Failures: 2, Window: time.Second, MinCalls: 100, FailureRatio: 1, OpenFor: time.Second, ReportEvery: time.Nanosecond,
			OnReport: func(r breaker.Report) { reports = append(reports, r) }}
		b := breaker.New(o, breaker.Errors{Open: errOpen, StalledOpen: errStalled, Outcome: outcome}, nil)
		c.fail(b, t0)
		c.fail(b, t0)
		if len(reports) != 1 || reports[0].To != breaker.Open || reports[0].Err != c.err || reports[0].Stalled != c.stalled {
			t.Fatalf("%s: reports %+v, want one opening with Err %v, Stalled %v", c.name, reports, c.err, c.stalled)
		}
		probe := t0.Add(o.OpenFor)
		if err := b.Allow(probe); err != nil {
			t.Fatalf("%s: probe refused: %v", c.name, err)
		}
		b.Record(probe, errRefused)
		if len(reports) != 2 || !reports[1].Still || reports[1].Err != errRefused || reports[1].Stalled {
			t.Errorf("%s: after a refused probe, reports %+v, want a still-open one with Err %v", c.name, reports, errRefused)
		}
	}
}
