package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestWarmReportsWhatRedisSaid: a warm-up that cannot succeed because
// Redis refuses it (a DB index out of range) ends, when its time is up,
// with Redis' own answer, not with the timeout of its last attempt.
func TestWarmReportsWhatRedisSaid(t *testing.T) {
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = strings.TrimSuffix(srv.URL(), "/0") + "/99"
	s := openStore(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := s.Warm(ctx)
	if err == nil {
		t.Fatal("Warm succeeded on DB 99")
	}
	if !strings.Contains(err.Error(), "DB index is out of range") {
		t.Errorf("Warm: %v (cause %s), want Redis' answer: DB index is out of range", err, redis.CauseOf(err))
	}
}
