// Package refdiff is the differential test suite against envoyproxy/ratelimit
// (the reference): it builds the reference's service from the Go module
// proxy at a pinned version, starts it and ratelimitd with the same
// envoyproxy/ratelimit-style environment (RUNTIME_ROOT, REDIS_URL, ...)
// and config directory on one real redis-server, sends both the same
// ShouldRateLimit sequences over gRPC and requires the same answers:
// overall code, per-descriptor statuses, current_limit, limit_remaining,
// duration_until_reset (within a second plus the time between the two
// answers), response headers and body, except for the differences the
// tests name. The configs are the reference's own integration configs,
// read from the module cache at test time, and one of this package's.
//
// configtests_test.go also compares the statsd stats each sends and
// whether a config loads at all; counting_test.go holds the sequences that
// depend on how hits inside a denied request are counted. The package has
// no non-test code.
package refdiff
