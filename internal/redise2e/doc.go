// Package redise2e holds in-process integration tests of the Redis backend
// through the real decision path: service.Service.ShouldRateLimit over
// pkg/backend/redis (with pkg/backend/memory as the failure_mode: local
// fallback) against real redis-server processes started by
// pkg/backend/redis/redistest (standalone, Cluster, Sentinel). They prove
// the Redis backend's end-to-end properties: exact counting across service instances,
// cross-slot all-or-nothing in Cluster, Sentinel failover, failure modes per
// rule with their latency bound, startup without Redis; with the
// PostgreSQL store of pkg/backend/postgres (servers from its pgtest) as
// the durable store, the durable limits' survival of a restart and a
// FLUSHALL, their exactness across instances and the independence of the
// two stores' failures (durable_test.go); and the
// BenchmarkShouldRateLimitRedis benchmark. The package has no non-test code.
package redise2e
