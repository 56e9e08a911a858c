package redis

import "testing"

// TestPenaltyKeySlot: a penalty box's key is in its hit key's hash slot
// and the three forms never collide.
func TestPenaltyKeySlot(t *testing.T) {
	seen := map[string]string{}
	for _, k := range []string{"a", "rl:abc", "{t}x", "x{t}", "a}b", "}", "{}x", "{a}:P", "{a}", "a:p", "{}", "x}{y}"} {
		pk := penaltyKey(k)
		if Slot(pk) != Slot(k) {
			t.Errorf("penaltyKey(%q) = %q: slot %d, want %d", k, pk, Slot(pk), Slot(k))
		}
		if o, dup := seen[pk]; dup {
			t.Errorf("penaltyKey(%q) = penaltyKey(%q) = %q", k, o, pk)
		}
		seen[pk] = k
	}
	for sl := range 16384 {
		if got := Slot(slotTag(uint16(sl))); got != uint16(sl) {
			t.Fatalf("slotTag(%d) has slot %d", sl, got)
		}
	}
}
