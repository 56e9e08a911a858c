// The module in which scripts/refsuite.sh runs envoyproxy/ratelimit's own
// integration suite against ratelimitd. It is a module of its own so that
// ratelimitd's build, vet and go mod tidy never see it; the script copies it
// to a temporary directory, adds the reference's test files and requires the
// reference module there.
module refsuite.local

go 1.25.6
