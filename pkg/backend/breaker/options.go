package breaker

import (
	"errors"
	"fmt"
	"time"
)

// State is the state of a circuit breaker.
type State int

const (
	// Closed: calls go to the backend.
	Closed State = iota
	// Open: calls fail immediately with Errors.Open or Errors.StalledOpen.
	Open
	// HalfOpen: OpenFor has passed; up to Probes probe calls at a
	// time go to the backend, the others fail immediately. A successful probe
	// closes the circuit; when every probe in flight has failed, it opens
	// again.
	HalfOpen
)

// String is the metric label: "closed", "open" or "half_open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Defaults of DefaultOptions.
const (
	DefaultFailures     = 5
	DefaultWindow       = time.Second
	DefaultMinCalls     = 20
	DefaultFailureRatio = 0.5
	DefaultOpenFor      = 250 * time.Millisecond
	DefaultFailFor      = time.Second
	DefaultProbes       = 3
)

// Options configure a Breaker. Only errors the backend's Errors.Outcome
// calls Stalled or Failed count as failures (Redis: timeout, refused,
// loading, clusterdown, unknown connection errors); replies from a live
// server (OOM, READONLY, auth, script errors) and caller cancellations do
// not.
type Options struct {
	// Failures consecutive failures (no success in between) open the
	// circuit (>= 1), once they span at least FailFor.
	Failures int
	// FailFor is how long stalls (Outcome Stalled) must have been observed,
	// from the first to the latest, before either rule opens the circuit
	// (>= 0; 0: no minimum), so that a short stall, which times out every
	// call in flight at once, does not open it. A run of Failures that
	// includes a Failed outcome opens the circuit at once.
	FailFor time.Duration
	// Window is the sliding window of the failure ratio rule (>= 10 ms).
	Window time.Duration
	// MinCalls is the minimum of calls within Window before FailureRatio
	// applies (>= 1).
	MinCalls int
	// FailureRatio of failed calls within Window (when at least MinCalls)
	// opens the circuit; in (0, 1].
	FailureRatio float64
	// OpenFor is how long the circuit stays open before half-open probes
	// (> 0).
	OpenFor time.Duration
	// Probes is how many half-open probe calls may be in flight at once
	// (>= 0; 0 means 1). Several probes keep one call that lands on a
	// stale connection from reopening the circuit for another OpenFor.
	Probes int
	// Disabled turns the breaker off: every call goes to the backend.
	Disabled bool
	// OnTransition, when not nil, is called with the new state after each
	// change: Open (also again from half-open), HalfOpen when the first
	// probe is let through, Closed when a probe succeeded. It runs on the
	// goroutine that changed the state, outside the breaker's lock; keep it
	// fast (a log line, a counter).
	OnTransition func(to State)
	// OnReport, when not nil, is called with the reports of an outage, for
	// its log lines: when the circuit opens from closed, when it closes
	// again, and at most once per ReportEvery while failed probes keep it
	// open. It runs as OnTransition does, after it.
	OnReport func(Report)
	// ReportEvery is the least time between two OnReport calls of one
	// outage that says the circuit is still open (0:
	// DefaultReportEvery).
	ReportEvery time.Duration
}

// DefaultReportEvery is Options.ReportEvery when 0.
const DefaultReportEvery = 30 * time.Second

// Report is one report of an outage (see Options.OnReport).
type Report struct {
	// To is Open (the circuit opened, or is still open) or Closed.
	To State
	// Still: the circuit was open already; a failed probe opened it again.
	Still bool
	// FailedProbes is how many half-open probe rounds failed (the circuit
	// opening again) since the circuit opened from closed.
	FailedProbes int
	// Since is when the circuit opened from closed.
	Since time.Time
	// At is when the report was made. Since and At are read from the
	// breaker's clock (see New), which need not be the real time.
	At time.Time
	// Stalled (To Open): stalls alone opened the circuit (timeouts, or an
	// invocation left unanswered: Breaker.Overdue), no failure the
	// backend proved.
	Stalled bool
	// Err (To Open) is the error of the call whose failure opened the
	// circuit, or opened it again; nil when an unanswered invocation
	// (Breaker.Overdue) did.
	Err error
	// Node names the server whose circuit this is (a Redis Cluster
	// master's address), set by the backend that owns the breaker; ""
	// when the backend sets none.
	Node string
}

// OpenFor is how long the circuit has been out of closed: At - Since.
func (r Report) OpenFor() time.Duration { return r.At.Sub(r.Since) }

// DefaultOptions: open after 5 consecutive failures or >= 50% failed
// of >= 20 calls within 1 s, timeouts only once they have lasted 1 s;
// up to 3 probes after 250 ms.
func DefaultOptions() Options {
	return Options{
		Failures:     DefaultFailures,
		FailFor:      DefaultFailFor,
		Window:       DefaultWindow,
		MinCalls:     DefaultMinCalls,
		FailureRatio: DefaultFailureRatio,
		OpenFor:      DefaultOpenFor,
		Probes:       DefaultProbes,
	}
}

// Validate reports every out-of-range field, joined ("breaker: ..."; the
// backend prefixes its name).
func (o Options) Validate() error {
	if o.Disabled {
		return nil
	}
	var errs []error
	if o.Failures < 1 {
		errs = append(errs, fmt.Errorf("breaker: failures must be at least 1, got %d", o.Failures))
	}
	if o.Window < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("breaker: window must be at least 10ms, got %v", o.Window))
	}
	if o.MinCalls < 1 {
		errs = append(errs, fmt.Errorf("breaker: min calls must be at least 1, got %d", o.MinCalls))
	}
	if !(o.FailureRatio > 0 && o.FailureRatio <= 1) {
		errs = append(errs, fmt.Errorf("breaker: failure ratio must be in (0, 1], got %v", o.FailureRatio))
	}
	if o.OpenFor <= 0 {
		errs = append(errs, fmt.Errorf("breaker: open-for must be positive, got %v", o.OpenFor))
	}
	if o.FailFor < 0 {
		errs = append(errs, fmt.Errorf("breaker: fail-for must not be negative, got %v", o.FailFor))
	}
	if o.Probes < 0 {
		errs = append(errs, fmt.Errorf("breaker: probes must not be negative, got %d", o.Probes))
	}
	return errors.Join(errs...)
}

// Outcome is how a call's error counts.
type Outcome int

const (
	// Answered: the backend answered (a success, or an error reply from a
	// live server): it resets the consecutive failures, and a half-open
	// probe that answered closes the circuit.
	Answered Outcome = iota
	// Neutral: the call says nothing about the backend (the caller
	// canceled, the call ran out of budget while the backend was
	// answering, a refusal of this breaker): it counts for nothing.
	Neutral
	// Stalled: the backend did not answer in time (a timeout). Stalls open
	// the circuit only once they span FailFor; the circuit they open
	// refuses calls with Errors.StalledOpen.
	Stalled
	// Failed: the backend proved a failure (connection refused, not
	// serving). A run of Failures that includes one opens at once, and the
	// circuit refuses calls with Errors.Open.
	Failed
	// Dropped: an established connection was lost mid-call (EOF, reset).
	// The backend may still be up (an idle timeout, a proxy, an operator
	// killed the connection), so the calls in flight when the loss was
	// first recorded count as one failure, not as a run; a call that
	// started after it and was dropped too is another loss. Failures
	// losses within Window open the circuit at once (the connection cannot
	// be kept), and it refuses calls with Errors.Open.
	Dropped
)

// OutcomeOf is the Outcome of an error a backend classified: Neutral
// when neutral, else Stalled for an outage that is a timeout, Failed for
// another outage, and Answered for an error that is no outage (a reply
// from a live server).
func OutcomeOf(outage, timeout, neutral bool) Outcome {
	switch {
	case neutral:
		return Neutral
	case outage && timeout:
		return Stalled
	case outage:
		return Failed
	}
	return Answered
}

// Errors are what a backend's breaker refuses calls with and how it reads
// their errors.
type Errors struct {
	// Open refuses a call while failures the backend proved (Failed)
	// opened the circuit: the rules' failure modes decide.
	Open error
	// StalledOpen refuses a call while stalls alone opened it: nothing
	// proves a failure, so the backend gives it its timeout cause and the
	// service sheds it.
	StalledOpen error
	// Outcome classifies a call's non-nil error; Open and StalledOpen must
	// be Neutral.
	Outcome func(err error) Outcome
}
