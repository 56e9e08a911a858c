package memcache_test

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
)

// TestCounterKeyGolden pins the memcached key of a hit key and a window
// start: these strings are the counters of running deployments (a change
// resets every counter on upgrade; never edit one to make a test pass). The
// hit keys are policy keys (pkg/policy TestKeyGolden pins those): a hashed
// one, a clear-text one, and clear-text keys memcached refuses as they
// are (a space, a control character, longer than 250 bytes), which are
// hashed with the "rlmc1_" version tag.
func TestCounterKeyGolden(t *testing.T) {
	for _, c := range []struct {
		key     string
		startUs int64
		want    string
	}{
		{"rl:_JalEdyc7CC3s9s5oWoN3Q", 1767225600000000, "rl:_JalEdyc7CC3s9s5oWoN3Q_1767225600000000"},
		{"_JalEdyc7CC3s9s5oWoN3Q", 0, "_JalEdyc7CC3s9s5oWoN3Q_0"},
		{"rl:3:rl1,6:golden,4:rule,1:1,5:plain,1:=,1:v,", 1767225600000000, "rl:3:rl1,6:golden,4:rule,1:1,5:plain,1:=,1:v,_1767225600000000"},
		{"rl:3:rl1,6:golden,4:rule,1:1,5:plain,1:=,3:a b,", 1767225600000000, "rlmc1_fbfPNF0cl5JHYQ16Vh6tHw"},
		{"rl:3:rl1,6:golden,4:rule,1:1,5:plain,1:=,3:a\x01b,", 1767225600000000, "rlmc1_lbf9WAG7i8iaGs5y3VT4lQ"},
		{"rl:" + strings.Repeat("x", 240), 1767225600000000, "rlmc1_pwgAT9GZNeI158L5-qvXLw"},
	} {
		got := memcache.CounterKey(c.key, c.startUs)
		if got != c.want {
			t.Errorf("CounterKey(%q, %d) = %q, want %q", c.key, c.startUs, got, c.want)
		}
	}
}
