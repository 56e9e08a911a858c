package opterr

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Each wording of Error, and OptionField's package-qualified field.
func TestFieldError(t *testing.T) {
	for _, c := range []struct {
		err        *FieldError
		want       string
		field, why string
	}{
		{&FieldError{Package: "xds", Field: "BackoffMax", Value: time.Second, Reason: "must be >= BackoffInitial (10s)"},
			"xds: BackoffMax=1s: must be >= BackoffInitial (10s)", "xds.BackoffMax", "must be >= BackoffInitial (10s)"},
		{&FieldError{Package: "lease", Field: "Store", Reason: "required"},
			"lease: Store=<nil>: required", "lease.Store", "required"},
		{&FieldError{Package: "memcache", Field: "Timeout", Label: "timeout", Value: time.Duration(0), Reason: "must be > 0"},
			"memcache: timeout 0s: must be > 0", "memcache.Timeout", "must be > 0"},
		{&FieldError{Package: "redis", Field: "Breaker.Window", Reason: "breaker window must be positive, got 0s", Sentence: true},
			"redis: breaker window must be positive, got 0s", "redis.Breaker.Window", "breaker window must be positive, got 0s"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
		if f, why := c.err.OptionField(); f != c.field || why != c.why {
			t.Errorf("%q: OptionField() = %q, %q, want %q, %q", c.want, f, why, c.field, c.why)
		}
		var fe *FieldError
		if wrapped := fmt.Errorf("options: %w", errors.Join(errors.New("other"), c.err)); !errors.As(wrapped, &fe) || fe != c.err {
			t.Errorf("%q: errors.As through a join and a wrap = %v", c.want, fe)
		}
	}
}
