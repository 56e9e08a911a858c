package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// TestClassify: server error codes, the caller's context and sockets map
// to their causes, outages and breaker outcomes; secrets are scrubbed
// from every message.
func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err     error
		cause   string
		outage  bool
		outcome breaker.Outcome
	}{
		{&pgconn.PgError{Code: "25006"}, CauseReadOnly, true, breaker.Failed},
		{&pgconn.PgError{Code: "28P01"}, CauseAuth, true, breaker.Failed},
		{&pgconn.PgError{Code: "57P01"}, CauseRefused, true, breaker.Failed},
		{&pgconn.PgError{Code: "57P03"}, CauseRefused, true, breaker.Failed},
		{&pgconn.PgError{Code: "08006"}, CauseRefused, true, breaker.Failed},
		{&pgconn.PgError{Code: "53300"}, CauseRefused, true, breaker.Failed},
		{&pgconn.PgError{Code: "55P03"}, CauseTimeout, false, breaker.Neutral},
		{&pgconn.PgError{Code: "42883"}, CauseSchema, false, breaker.Answered},
		{&pgconn.PgError{Code: "23505"}, CauseOther, false, breaker.Answered},
		{fmt.Errorf("query: %w", context.DeadlineExceeded), CauseTimeout, true, breaker.Stalled},
		{context.Canceled, CauseCanceled, false, breaker.Neutral},
		{refused, CauseRefused, true, breaker.Failed},
		{errBudgetCut, CauseTimeout, false, breaker.Neutral},
		{ErrCircuitOpen, CauseCircuitOpen, false, breaker.Neutral},
		{ErrStalledOpen, CauseTimeout, false, breaker.Neutral},
		{errTimeout, CauseTimeout, true, breaker.Stalled},
	} {
		err := classify(c.err, nil)
		var e *Error
		if !errors.As(err, &e) || e.Cause() != c.cause || e.Outage() != c.outage {
			t.Errorf("%v: cause %q outage %v, want %q %v", c.err, e.Cause(), e.Outage(), c.cause, c.outage)
		}
		if got := breakerOutcome(err); got != c.outcome {
			t.Errorf("%v: outcome %v, want %v", c.err, got, c.outcome)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%v: the classified error does not unwrap to it", c.err)
		}
	}
	err := classify(errors.New("dial postgres://u:s3cr%21t@h/db: s3cr!t"), Options{URL: "postgres://u:s3cr%21t@h/db"}.secrets())
	if got, want := err.Error(), "postgres: other: dial postgres://u:xxxxx@h/db: xxxxx"; got != want {
		t.Errorf("scrubbed %q, want %q", got, want)
	}
}
