package service

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// answerPolicy is how the service answers where envoyproxy/ratelimit's
// answers differ from ratelimitd's (Options.ReferenceAnswers picks one at
// New): the shape a request may have, the errors of a refused request,
// and the limit_remaining of a denied limit. Everything else is the same.
type answerPolicy interface {
	// emptyRequest is the error of a request without a domain or without
	// descriptors; msg says which.
	emptyRequest(msg string) error
	// emptyEntries reports whether a descriptor with no entries, or an
	// entry with an empty key, is accepted (it matches nothing).
	emptyEntries() bool
	// noConfig is the error of a call before the first config.
	noConfig() error
	// remaining is the limit_remaining reported for decision d, and the
	// legacy remaining header's value.
	remaining(d algo.Decision) int64
	// quotaDenies reports whether a request whose quota_mode descriptors
	// are all over their limits is denied (OVER_LIMIT overall).
	quotaDenies() bool
}

func newAnswerPolicy(reference bool) answerPolicy {
	if reference {
		return referenceAnswers{}
	}
	return nativeAnswers{}
}

// nativeAnswers are ratelimitd's answers: malformed requests fail with
// InvalidArgument, a call before the first config with Unavailable, and a
// denied limit reports what is left for a smaller request.
type nativeAnswers struct{}

func (nativeAnswers) emptyRequest(msg string) error { return invalid("%s", msg) }
func (nativeAnswers) emptyEntries() bool            { return false }
func (nativeAnswers) noConfig() error {
	return status.Error(codes.Unavailable, "service: no rate limit configuration loaded")
}
func (nativeAnswers) remaining(d algo.Decision) int64 { return max(d.Remaining, 0) }
func (nativeAnswers) quotaDenies() bool               { return true }

// referenceAnswers are envoyproxy/ratelimit's: a descriptor with no
// entries, or an entry with an empty key, matches nothing; an empty
// domain or descriptor list and a call before the first config fail with
// the reference's plain error (codes.Unknown, its message); a denied
// limit reports limit_remaining 0; quota_mode never denies the request
// (the violation shows only in its descriptor status and metadata).
type referenceAnswers struct{}

func (referenceAnswers) emptyRequest(msg string) error { return referenceError(msg) }
func (referenceAnswers) emptyEntries() bool            { return true }
func (referenceAnswers) noConfig() error               { return referenceError("no rate limit configuration loaded") }
func (referenceAnswers) quotaDenies() bool             { return false }
func (referenceAnswers) remaining(d algo.Decision) int64 {
	if !d.Allowed {
		return 0
	}
	return max(d.Remaining, 0)
}

// referenceError is the error envoyproxy/ratelimit returns for a request
// it refuses: a plain error, which gRPC sends as codes.Unknown with the
// message as is.
func referenceError(msg string) error { return status.Error(codes.Unknown, msg) }
