package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// redisLogEvery is how often one kind of go-redis log line (same format
// string) may reach the log at WARN; the others go to DEBUG.
const redisLogEvery = 10 * time.Second

// redisLogger routes go-redis' internal log lines (redis.SetLogger, e.g.
// "redis: connection pool: failed to dial after 5 attempts: … connection
// refused") into the process's slog logger, so they follow --log-format
// and --log-level instead of going to stderr unstructured. Each format
// string is logged at WARN at most once per every, with the number of lines
// of that kind suppressed since; the suppressed lines are logged at DEBUG.
// Backend failures are also counted in ratelimitd_backend_errors_total.
type redisLogger struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*redisLogKind
}

type redisLogKind struct {
	last       time.Time
	suppressed int
}

// redisLogKinds bounds the map of format strings (go-redis has about 200).
const redisLogKinds = 1024

func newRedisLogger(log *slog.Logger, every time.Duration, now func() time.Time) *redisLogger {
	return &redisLogger{log: log, every: every, now: now, kinds: map[string]*redisLogKind{}}
}

// Printf implements go-redis' internal.Logging.
func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	line := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	now := l.now()
	l.mu.Lock()
	k := l.kinds[format]
	if k == nil {
		if len(l.kinds) >= redisLogKinds {
			clear(l.kinds)
		}
		k = &redisLogKind{}
		l.kinds[format] = k
	}
	warn := k.last.IsZero() || now.Sub(k.last) >= l.every
	suppressed := k.suppressed
	if warn {
		k.last, k.suppressed = now, 0
	} else {
		k.suppressed++
	}
	l.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	if warn {
		l.log.WarnContext(ctx, "redis client", "line", line, "suppressed", suppressed)
		return
	}
	l.log.DebugContext(ctx, "redis client", "line", line)
}
