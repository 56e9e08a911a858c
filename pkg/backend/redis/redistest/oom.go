package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartOOM fills srv with 4 MB and lowers maxmemory 1 MB below its
// used_memory (maxmemory-policy set to noeviction): every write,
// a script's included, is refused with OOM whatever buffers come and go.
func StartOOM(t testing.TB, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctl := srv.Client()
	big := strings.Repeat("x", 64<<10)
	for i := range 64 {
		if err := ctl.Set(ctx, "fill:"+strconv.Itoa(i), big, 0).Err(); err != nil {
			t.Fatalf("filling: %v", err)
		}
	}
	info, err := ctl.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used := InfoInt(t, info, "used_memory")
	if err := ctl.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Set(ctx, "oom-check", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("a write with maxmemory below used_memory: %v, want OOM", err)
	}
}

// EndOOM lifts maxmemory (0: none).
func EndOOM(t testing.TB, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Client().ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}
