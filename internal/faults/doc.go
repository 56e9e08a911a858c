// Package faults is the fault suite of ratelimitd as a user runs it: real
// `ratelimitd serve` processes (the binary built once by TestMain, with
// -race when the tests run with it) with their default flags, in front of
// real redis-server deployments started by pkg/backend/redis/redistest
// (standalone, TLS 1.3 only, Sentinel with a replica, a 3-master Cluster),
// called over gRPC like Envoy calls them.
//
// It proves two properties with exact counts, whatever the machine's load:
//
//   - never over-admit: a burst of C concurrent ShouldRateLimit calls on
//     one fresh key with limit L, spread over 3 instances, freshly started
//     or warm, with both CPUs idle or pinned by busy loops, is answered OK
//     exactly L times when the caller sets no deadline, and at most as
//     many times as the store counted when the caller gives up after
//     Envoy's 20 ms (TestBursts); a Sentinel failover under load, with
//     min-replicas-to-write 1 and --redis-wait-replicas=1, loses no
//     counted hit (TestSentinelFailoverCounts);
//   - never stay failed open: after Redis is killed, frozen, restarted or
//     out of memory, and then 3 s without traffic, the next call is
//     counted, and the gRPC health of "ratelimitd.backend" is NOT_SERVING
//     during the fault and SERVING within 1 s after it (TestFaults).
//
// Timing is never asserted except the health bounds above; latency belongs
// to the benchmarks. RATELIMITD_LONG=1 (`make test-long`) repeats each
// burst 20 times. The package has no non-test code.
package faults
