package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// LogEvery is how often one kind of go-redis log line (same format string)
// may reach a SlogLogger's log at WARN, as ratelimitd runs it; the others
// go to DEBUG.
const LogEvery = 10 * time.Second

// SlogLogger routes go-redis' internal log lines (SetLogger, e.g.
// "redis: connection pool: failed to dial after 5 attempts: … connection
// refused") into a slog logger, so they follow the process's log format
// and level instead of going to stderr unstructured. Each format
// string is logged at WARN at most once per every, with the number of lines
// of that kind suppressed since; the suppressed lines are logged at DEBUG.
// Backend failures are also counted in ratelimitd_backend_errors_total.
// Safe for concurrent use.
type SlogLogger struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*logKind
}

type logKind struct {
	last       time.Time
	suppressed int
}

// logKinds bounds the map of format strings (go-redis has about 200).
const logKinds = 1024

// NewSlogLogger returns a SlogLogger on log that lets one line of each
// kind through at WARN per every, by the clock now (time.Now).
func NewSlogLogger(log *slog.Logger, every time.Duration, now func() time.Time) *SlogLogger {
	return &SlogLogger{log: log, every: every, now: now, kinds: map[string]*logKind{}}
}

// Printf implements Logger.
func (l *SlogLogger) Printf(ctx context.Context, format string, v ...any) {
	line := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	now := l.now()
	l.mu.Lock()
	k := l.kinds[format]
	if k == nil {
		if len(l.kinds) >= logKinds {
			clear(l.kinds)
		}
		k = &logKind{}
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
