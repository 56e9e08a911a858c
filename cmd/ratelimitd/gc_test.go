package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// TestGCOffNeedsMemoryLimit: --gc-percent=-1 needs a memory limit: without
// one, serve does not start.
func TestGCOffNeedsMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		args   []string
		env    []string
		cgroup func() (uint64, error)
	}{
		{[]string{"--gc-percent=-1"}, nil, cgroupOf(0, memlimit.ErrNoLimit)},
		{[]string{"--gc-percent=-1", "--memory-limit-ratio=0"}, nil, cgroupOf(512*mib, nil)},
		{[]string{"--gc-percent=-1"}, []string{"GOMEMLIMIT", "off"}, cgroupOf(512*mib, nil)},
	} {
		o, _, err := serveopts.Parse(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := serveopts.ChooseGC(o, env(c.env...), c.cgroup, runtimeSays(100, math.MaxInt64)); err == nil || !strings.Contains(err.Error(), "--gc-percent=-1") {
			t.Errorf("%v %v: err %v", c.args, c.env, err)
		}
	}
	// Through run: exit 2 before anything listens.
	defer func(f func() (uint64, error)) { cgroupMemoryLimit = f }(cgroupMemoryLimit)
	cgroupMemoryLimit = cgroupOf(0, memlimit.ErrNoLimit)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--gc-percent=-1", "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr="}, env(), &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "--gc-percent=-1 turns the GC off and needs a memory limit") {
		t.Errorf("exit %d:\n%s", code, errb.String())
	}
}

const mib = 1 << 20

// runtimeSays fakes the runtime's view of GOGC/GOMEMLIMIT.
func runtimeSays(percent int, limit int64) func() (int, int64) {
	return func() (int, int64) { return percent, limit }
}
