package policy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// ConfigError is one problem found while loading configuration. Load joins
// every ConfigError it finds with errors.Join; use errors.As on the joined
// error's Unwrap() []error to inspect them.
type ConfigError struct {
	File string // path as given to Load (or found under a directory)
	Line int    // 1-based; 0 when the problem has no line (e.g. unreadable file)
	// Message is the problem, without the position ("duplicate key
	// \"unit\" (first at line 3)").
	Message string
	// Err is the I/O error of a read problem (a config path or file that
	// could not be stat'ed, walked or read; Message then includes it),
	// nil for a problem in the config itself. See IsReadError.
	Err error
}

// Error returns "file:line: message" (the format `ratelimitd validate`
// prints and editors understand).
func (e *ConfigError) Error() string { return formatPos(e.File, e.Line) + ": " + e.Message }

// Unwrap returns Err (nil for a problem in the config itself), so
// errors.Is(err, fs.ErrNotExist) works on Load's error.
func (e *ConfigError) Unwrap() error { return e.Err }

// IsReadError reports whether err, an error from Load (possibly wrapped),
// consists of read problems only: every ConfigError in it has Err set. Such
// a load says nothing about the config's validity (a file deleted,
// unreadable, or replaced while being read), so it is not a rejected
// config. false for nil, for any problem in the config itself, and for
// errors that hold no ConfigError.
func IsReadError(err error) bool {
	switch e := err.(type) {
	case *ConfigError:
		return e.Err != nil
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, x := range errs {
			if !IsReadError(x) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return IsReadError(e.Unwrap())
	}
	return false
}

// WatchError is an error of Watch's file watcher itself (an fsnotify
// error, e.g. fsnotify.ErrEventOverflow when events were dropped), passed
// to Watch's fail callback. It says nothing about the config: the config in
// force stays, and Watch reloads (a lost event may have been a change).
type WatchError struct {
	Err error // the watcher's error; never nil
}

// Error returns "policy: watch: " followed by Err's message.
func (e *WatchError) Error() string { return "policy: watch: " + e.Err.Error() }

// Unwrap returns Err.
func (e *WatchError) Unwrap() error { return e.Err }

// IsWatchError reports whether err is or wraps a *WatchError.
func IsWatchError(err error) bool {
	var we *WatchError
	return errors.As(err, &we)
}

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

// addRead records a read problem: cause is the I/O error (ConfigError.Err).
func (l *errList) addRead(file string, cause error, format string, args ...any) {
	l.errs = append(l.errs, &ConfigError{File: file, Message: fmt.Sprintf(format, args...), Err: cause})
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
