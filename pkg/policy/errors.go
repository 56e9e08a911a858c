package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
)

// ConfigError is one problem found while loading configuration. Load joins
// every ConfigError it finds with errors.Join; use errors.As on the joined
// error's Unwrap() []error to inspect them.
type ConfigError struct {
	File    string // path as given to Load (or found under a directory)
	Line    int    // 1-based; 0 when the problem has no line (e.g. unreadable file)
	Message string
}

// Error returns "file:line: message" (the format `ratelimitd validate`
// prints and editors understand).
func (e *ConfigError) Error() string { return formatPos(e.File, e.Line) + ": " + e.Message }

func formatPos(file string, line int) string {
	if line <= 0 {
		return file
	}
	return file + ":" + strconv.Itoa(line)
}

// errList collects ConfigErrors and Warnings during a load.
type errList struct {
	errs     []error
	warnings []Warning
}

func (l *errList) add(file string, line int, format string, args ...any) {
	l.errs = append(l.errs, &ConfigError{File: file, Line: line, Message: fmt.Sprintf(format, args...)})
}

func (l *errList) warn(file string, line int, format string, args ...any) {
	l.warnings = append(l.warnings, Warning{File: file, Line: line, Message: fmt.Sprintf(format, args...)})
}

// sort orders errors and warnings by file, then line (stable, so problems
// on one line keep the order they were found in): compile-time errors such
// as duplicate composite keys land next to the parse errors of their file.
func (l *errList) sort() {
	slices.SortStableFunc(l.errs, func(a, b error) int {
		ca, _ := a.(*ConfigError)
		cb, _ := b.(*ConfigError)
		if ca == nil || cb == nil {
			return 0
		}
		return cmp.Or(cmp.Compare(ca.File, cb.File), cmp.Compare(ca.Line, cb.Line))
	})
	slices.SortStableFunc(l.warnings, func(a, b Warning) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
}
