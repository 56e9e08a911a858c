package policy

// STUB: placeholder implementations so dependents compile while the policy
// package is being written. The policy implementation replaces this file.

import (
	"context"
	"errors"
	"fmt"
	"io"
)

func formatPos(file string, line int) string { return fmt.Sprintf("%s:%d", file, line) }

// Set is a compiled, immutable configuration snapshot. Safe for concurrent use.
type Set struct{}

func Load(opts LoadOptions, paths ...string) (*Set, []Warning, error) {
	return nil, nil, errors.New("policy: not implemented")
}

func (s *Set) HasDomain(domain string) bool                       { return false }
func (s *Set) Match(domain string, entries []Entry) (Match, bool) { return Match{}, false }
func (s *Set) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) Match {
	return Match{}
}
func (s *Set) Key(m Match, i int) string      { return "" }
func (s *Set) Hash() string                   { return "" }
func (s *Set) Domains() []string              { return nil }
func (s *Set) Rules() []*Rule                 { return nil }
func (s *Set) WriteExplain(w io.Writer) error { return nil }

func Watch(ctx context.Context, opts LoadOptions, paths []string, apply func(*Set, []Warning), fail func(error)) error {
	return errors.New("policy: not implemented")
}
