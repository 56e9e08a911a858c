// Package redise2e holds in-process integration tests of the Redis backend
// through the real decision path: service.Service.ShouldRateLimit over
// pkg/backend/redis (with pkg/backend/memory as the failure_mode: local
// fallback) against real redis-server processes started by
// pkg/backend/redis/redistest (standalone, Cluster, Sentinel): exact
// counting across service instances, cross-slot all-or-nothing in
// Cluster, Sentinel failover, failure modes per rule with their latency
// bound, startup without Redis, and, with PostgreSQL as the durable store
// (durable_test.go), the durable limits' survival and exactness. The
// package has no non-test code.
package redise2e
