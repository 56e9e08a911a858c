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
// configtests_test.go sends the descriptors of the reference's own config
// tests (its test/config) to both servers loaded with those tests' files,
// and compares the statsd stats each sends besides the answers, and
// whether the config loads at all (one file loaded twice is refused by
// both, and by `ratelimitd validate` with the same environment).
//
// The sequences that depend on how hits inside a denied request are
// counted (several descriptors, one denying) are in counting_test.go;
// reference mode counts as the reference does (always_charge). The two
// answers reference mode does not reproduce (a check-only hits_addend of
// 0 at exactly the limit, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true)
// are named steps of those sequences, asserted in every run
// (named_test.go). The package has no non-test code.
package refdiff
