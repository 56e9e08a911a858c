// Package loglimit samples log lines: at most one line per key per
// interval, counting the lines it suppressed, so that a flood of one
// event cannot flood the log.
package loglimit

import (
	"sync"
	"time"
)

// Limiter lets one log line per key through per interval and counts the
// suppressed ones. Its zero value is not usable; use New. Keys should be
// bounded (a rule, a cause), since each is remembered.
type Limiter struct {
	mu         sync.Mutex
	every      time.Duration
	last       map[string]time.Time
	suppressed map[string]int
}

// New returns a Limiter that lets one line per key through every every.
func New(every time.Duration) *Limiter {
	return &Limiter{every: every, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// Allow reports whether a line for key may be logged at now, and how
// many were suppressed since the last one.
func (l *Limiter) Allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.every {
		l.suppressed[key]++
		return false, 0
	}
	n := l.suppressed[key]
	l.suppressed[key] = 0
	l.last[key] = now
	return true, n
}
