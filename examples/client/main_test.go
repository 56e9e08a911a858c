package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// TestHitsFlagRange: -hits takes 0 to the largest uint32 and refuses a
// larger or negative value with an error naming the maximum, never
// truncating it.
func TestHitsFlagRange(t *testing.T) {
	max := strconv.FormatUint(math.MaxUint32, 10)
	for _, ok := range []string{"0", "1", max} {
		var h hitsFlag
		if err := h.Set(ok); err != nil || h.String() != ok {
			t.Errorf("-hits %s: %v (value %s), want it taken", ok, err, h.String())
		}
	}
	for _, bad := range []string{strconv.FormatUint(math.MaxUint32+1, 10), "99999999999999999999"} {
		var h hitsFlag
		err := h.Set(bad)
		if err == nil || !strings.Contains(err.Error(), "out of range (max "+max+")") {
			t.Errorf("-hits %s: %v (value %s), want out of range (max %s)", bad, err, h.String(), max)
		}
	}
	for _, bad := range []string{"-1", "ten", "1.5"} {
		var h hitsFlag
		if err := h.Set(bad); err == nil {
			t.Errorf("-hits %s: taken as %s, want an error", bad, h.String())
		}
	}
}
