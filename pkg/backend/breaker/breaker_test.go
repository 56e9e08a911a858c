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

// TestDroppedConnection: the calls in flight when a connection loss is
// first recorded (started before it) are one failure, however many; a
// call started after it and dropped too is another loss, and Failures
// losses within Window open the circuit with Errors.Open; a loss followed
// by refused dials (a dead backend) opens it as a run of proven failures.
func TestDroppedConnection(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	errDropped := errors.New("dropped")
	o := breaker.Options{Failures: 5, Window: time.Second, MinCalls: 20, FailureRatio: 0.5, OpenFor: 250 * time.Millisecond, FailFor: time.Second}
	errs := breaker.Errors{Open: errOpen, StalledOpen: errStalled, Outcome: func(err error) breaker.Outcome {
		if err == errDropped {
			return breaker.Dropped
		}
		return outcome(err)
	}}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

	t.Run("one loss, many calls in flight", func(t *testing.T) {
		b := breaker.New(o, errs, nil)
		// 500 calls started at 0..4 ms, all dropped at 10..14 ms.
		for i := range 500 {
			b.RecordSince(ms(i%5), ms(10+i%5), errDropped)
		}
		if got := b.Allow(ms(20)); got != nil || b.Opened() != 0 {
			t.Fatalf("after one loss of 500 calls in flight: Allow = %v, opened %d; want closed", got, b.Opened())
		}
		// Four more losses of fresh calls within Window, with answers in
		// between: the loss count opens it on the fifth, not the run.
		for i := range 4 {
			at := 100 * (i + 1)
			b.Record(ms(at), nil)
			if got := b.Allow(ms(at)); got != nil {
				t.Fatalf("loss %d: Allow = %v, want closed", i+2, got)
			}
			b.RecordSince(ms(at+1), ms(at+2), errDropped)
		}
		if got := b.Allow(ms(500)); got != errOpen {
			t.Fatalf("after 5 losses within Window: Allow = %v, want %v", got, errOpen)
		}
	})
	t.Run("losses spread over more than Window", func(t *testing.T) {
		b := breaker.New(o, errs, nil)
		for i := range 20 {
			at := 300 * i // at most 4 losses within any Window
			b.RecordSince(ms(at), ms(at+1), errDropped)
			b.Record(ms(at+2), nil)
		}
		if b.Opened() != 0 {
			t.Errorf("a loss every 300 ms opened the circuit %d times, want never (4 within Window at most)", b.Opened())
		}
	})
	t.Run("a loss then refused dials", func(t *testing.T) {
		b := breaker.New(o, errs, nil)
		b.RecordSince(ms(0), ms(5), errDropped)
		for i := range 4 {
			b.Record(ms(6+i), errRefused)
		}
		if got := b.Allow(ms(10)); got != errOpen {
			t.Fatalf("a loss and 4 refused dials: Allow = %v, want %v", got, errOpen)
		}
	})
}
