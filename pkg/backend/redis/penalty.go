package redis

import (
	"strconv"
	"strings"
	"sync"
)

// penaltyKey is the key of the penalty box of the hit on key
// (algo.Hit.Penalty; take/45_penalty.lua), in key's hash slot: "<key>:p"
// when key has a hash tag, "{<key>}:P" when it has no '}', else
// "{<tag>}<key>:q" with a tag of the same slot (slotTag). The last byte
// tells the three forms apart and each form gives key back, so the keys
// are injective; none ends in a window key's digits (windowKey).
func penaltyKey(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 && strings.IndexByte(key[i+1:], '}') > 0 {
		return key + ":p"
	}
	if strings.IndexByte(key, '}') < 0 {
		return "{" + key + "}:P"
	}
	return "{" + slotTag(Slot(key)) + "}" + key + ":q"
}

// slotTags holds, per hash slot, the shortest base-36 number whose
// CRC16 falls in it (the first 16384 slots found counting up).
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, 16384)
	left := len(tags)
	for n := int64(0); left > 0; n++ {
		s := strconv.FormatInt(n, 36)
		if sl := crc16(s) & 16383; tags[sl] == "" {
			tags[sl] = s
			left--
		}
	}
	return tags
})

// slotTag is a hash tag whose slot is sl.
func slotTag(sl uint16) string { return slotTags()[sl] }
