// Package opterr is the error a package's Options.Validate reports about
// one field, shared so that a caller naming fields its own way (a
// command-line flag) handles every package's errors alike.
package opterr

import "fmt"

// FieldError is one invalid field of a package's Options. Error words it
// "Package: Field=Value: Reason" unless Label or Sentence says otherwise;
// OptionField gives the package-qualified field and the reason.
type FieldError struct {
	// Package is the reporting package's name ("xds"): Error's prefix and
	// OptionField's qualifier.
	Package string
	// Field is the Options field's path ("BackoffMax", "Breaker.Window").
	Field string
	// Value is the field's value.
	Value any
	// Reason is what a valid value is ("must be in [0, 1]"), or with
	// Sentence the whole message after the package.
	Reason string
	// Label, when set, names the field in Error instead of Field:
	// "Package: Label Value: Reason" ("memcache: timeout 0s: must be > 0").
	Label string
	// Sentence says Reason names the field and its value itself: Error is
	// "Package: Reason".
	Sentence bool
}

// Error is described at FieldError.
func (e *FieldError) Error() string {
	switch {
	case e.Sentence:
		return e.Package + ": " + e.Reason
	case e.Label != "":
		return fmt.Sprintf("%s: %s %v: %s", e.Package, e.Label, e.Value, e.Reason)
	}
	return fmt.Sprintf("%s: %s=%v: %s", e.Package, e.Field, e.Value, e.Reason)
}

// OptionField returns the package-qualified field ("xds.BackoffMax") and
// the reason, for callers that name the field their own way.
func (e *FieldError) OptionField() (field, reason string) { return e.Package + "." + e.Field, e.Reason }
