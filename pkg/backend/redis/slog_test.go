package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

func TestRedisLogger(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	now := time.Unix(1000, 0)
	l := redis.NewSlogLogger(log, 10*time.Second, func() time.Time { return now })
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	steps := []struct {
		at     time.Duration
		format string
		level  string
		supp   int // for WARN lines
	}{
		{0, dial, "WARN", 0},
		{time.Second, dial, "DEBUG", 0},
		{2 * time.Second, dial, "DEBUG", 0},
		{3 * time.Second, "redis: sentinel: %v %d", "WARN", 0}, // another kind has its own budget
		{10 * time.Second, dial, "WARN", 2},
		{11 * time.Second, dial, "DEBUG", 0},
	}
	for i, st := range steps {
		now = time.Unix(1000, 0).Add(st.at)
		buf.Reset()
		l.Printf(context.Background(), st.format, 5, "dial tcp 127.0.0.1:1: connect: connection refused")
		var rec struct {
			Level, Msg, Line string
			Suppressed       *int
		}
		if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
			t.Fatalf("step %d: %v: %q", i, err, buf.String())
		}
		if rec.Level != st.level || rec.Msg != "redis client" || !strings.HasPrefix(rec.Line, "connection pool") && !strings.HasPrefix(rec.Line, "sentinel") {
			t.Errorf("step %d: %+v", i, rec)
		}
		if st.level == "WARN" && (rec.Suppressed == nil || *rec.Suppressed != st.supp) {
			t.Errorf("step %d: suppressed %v, want %d", i, rec.Suppressed, st.supp)
		}
	}
	// At --log-level info the suppressed lines vanish.
	buf.Reset()
	quiet := redis.NewSlogLogger(slog.New(slog.NewJSONHandler(&buf, nil)), time.Hour, time.Now)
	for range 100 {
		quiet.Printf(context.Background(), dial, 1, "refused")
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Errorf("%d lines at info for 100 identical errors, want 1", n)
	}
}
