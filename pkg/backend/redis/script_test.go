package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestSlotMatchesServer compares Slot with CLUSTER KEYSLOT on a
// cluster-enabled redis-server, for keys with and without hash tags.
func TestSlotMatchesServer(t *testing.T) {
	srv := redistest.Standalone(t, redistest.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
	c := srv.Client()
	ctx := context.Background()
	keys := []string{"", "a", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "}{", "{a", "rl:\x00\xff{x}", "123456789"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = "ab{}:\x00\xfe"[r.IntN(7)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
	if got := crc16("123456789"); got != 0x31C3 { // the spec's check value
		t.Errorf("crc16 check value %#x, want 0x31c3", got)
	}
}

// TestScriptArgsShape: ARGV has 3 header fields and fieldsPerHit per hit,
// matching NF in take.lua.
func TestScriptArgsShape(t *testing.T) {
	if want := fmt.Sprintf("local NF = %d", fieldsPerHit); !strings.Contains(takeLua, want) {
		t.Fatalf("take.lua does not declare %q", want)
	}
}
