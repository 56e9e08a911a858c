package serveopts

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/google/go-cmp/cmp"
	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
)

const (
	mib            = 1 << 20
	limit80of512Mi = 429496729 // floor(0.8 × 512 MiB)
)

func cgroupOf(n uint64, err error) func() (uint64, error) {
	return func() (uint64, error) { return n, err }
}

// runtimeSays fakes the runtime's view of GOGC/GOMEMLIMIT.
func runtimeSays(percent int, limit int64) func() (int, int64) {
	return func() (int, int64) { return percent, limit }
}

// TestChooseGC: serve's GC flags, twins and GOGC/GOMEMLIMIT reach
// gcpolicy.Choose, which picks each setting and its source as documented,
// with or without a cgroup memory limit.
func TestChooseGC(t *testing.T) {
	notInCgroup := errors.New("process is not in cgroup")
	for _, c := range []struct {
		name    string
		args    []string
		env     []string
		cgroup  func() (uint64, error)
		runtime func() (int, int64)
		want    gcpolicy.Policy
	}{
		{"defaults in a 512Mi container", nil, nil, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: limit80of512Mi, LimitSource: "cgroup", Cgroup: 512 * mib, PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0.8"}},
		{"no cgroup limit", nil, nil, cgroupOf(0, memlimit.ErrNoLimit), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: math.MaxInt64, LimitSource: "none", CgroupNote: "the cgroup sets no memory limit", PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0.8"}},
		{"not in a cgroup", nil, nil, cgroupOf(0, notInCgroup), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: math.MaxInt64, LimitSource: "none", CgroupNote: "no cgroup memory limit: process is not in cgroup", PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0.8"}},
		{"ratio flag", []string{"--memory-limit-ratio=0.5"}, nil, cgroupOf(1000*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: 500 * mib, LimitSource: "cgroup", Cgroup: 1000 * mib, PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0.5"}},
		{"ratio twin", nil, []string{"RATELIMITD_MEMORY_LIMIT_RATIO", "1"}, cgroupOf(1000*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: 1000 * mib, LimitSource: "cgroup", Cgroup: 1000 * mib, PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=1 from RATELIMITD_MEMORY_LIMIT_RATIO"}},
		{"ratio 0: no limit, cgroup not read", []string{"--memory-limit-ratio=0"}, nil, func() (uint64, error) { panic("cgroup read") }, runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: math.MaxInt64, LimitSource: "none", PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0"}},
		{"explicit limit beats cgroup", []string{"--memory-limit=400MiB"}, nil, func() (uint64, error) { panic("cgroup read") }, runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: 400 * mib, LimitSource: "flag", PercentBy: "--gc-percent=400", LimitBy: "--memory-limit=400MiB"}},
		{"limit twin", nil, []string{"RATELIMITD_MEMORY_LIMIT", "300Mi"}, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: 300 * mib, LimitSource: "flag", PercentBy: "--gc-percent=400", LimitBy: "--memory-limit=300MiB from RATELIMITD_MEMORY_LIMIT"}},
		{"GOMEMLIMIT beats flag", []string{"--memory-limit=400MiB"}, []string{"GOMEMLIMIT", "256MiB"}, cgroupOf(512*mib, nil), runtimeSays(100, 256*mib),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: 256 * mib, LimitSource: "env", PercentBy: "--gc-percent=400", LimitBy: "GOMEMLIMIT=256MiB"}},
		{"GOMEMLIMIT=off", nil, []string{"GOMEMLIMIT", "off"}, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: math.MaxInt64, LimitSource: "env", PercentBy: "--gc-percent=400", LimitBy: "GOMEMLIMIT=off"}},
		{"GOGC beats flag", []string{"--gc-percent=200"}, []string{"GOGC", "150"}, cgroupOf(512*mib, nil), runtimeSays(150, math.MaxInt64),
			gcpolicy.Policy{Percent: 150, PercentSource: "env", Limit: limit80of512Mi, LimitSource: "cgroup", Cgroup: 512 * mib, PercentBy: "GOGC=150", LimitBy: "--memory-limit-ratio=0.8"}},
		{"empty GOGC is unset", nil, []string{"GOGC", ""}, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 400, PercentSource: "flag", Limit: limit80of512Mi, LimitSource: "cgroup", Cgroup: 512 * mib, PercentBy: "--gc-percent=400", LimitBy: "--memory-limit-ratio=0.8"}},
		{"gc percent twin", nil, []string{"RATELIMITD_GC_PERCENT", "100"}, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: 100, PercentSource: "flag", Limit: limit80of512Mi, LimitSource: "cgroup", Cgroup: 512 * mib, PercentBy: "--gc-percent=100 from RATELIMITD_GC_PERCENT", LimitBy: "--memory-limit-ratio=0.8"}},
		{"GC off with a cgroup limit", []string{"--gc-percent=-1"}, nil, cgroupOf(512*mib, nil), runtimeSays(100, math.MaxInt64),
			gcpolicy.Policy{Percent: -1, PercentSource: "flag", Limit: limit80of512Mi, LimitSource: "cgroup", Cgroup: 512 * mib, PercentBy: "--gc-percent=-1", LimitBy: "--memory-limit-ratio=0.8"}},
		{"GOGC=off without a limit is the operator's choice", nil, []string{"GOGC", "off"}, cgroupOf(0, memlimit.ErrNoLimit), runtimeSays(-1, math.MaxInt64),
			gcpolicy.Policy{Percent: -1, PercentSource: "env", Limit: math.MaxInt64, LimitSource: "none", CgroupNote: "the cgroup sets no memory limit", PercentBy: "GOGC=off", LimitBy: "--memory-limit-ratio=0.8"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, _, err := Parse(c.args, env(c.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ChooseGC(o, env(c.env...), c.cgroup, c.runtime)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestGCFlagErrors: an out-of-range or malformed GC setting is refused
// with an error naming the flag or twin.
func TestGCFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--gc-percent=-2"}, nil, "--gc-percent=-2"},
		{[]string{"--memory-limit-ratio=1.2"}, nil, "--memory-limit-ratio=1.2"},
		{[]string{"--memory-limit-ratio=-0.1"}, nil, "--memory-limit-ratio=-0.1"},
		{[]string{"--memory-limit=400XB"}, nil, "memory-limit"},
		{[]string{"--memory-limit=-5MiB"}, nil, "memory-limit"},
		{nil, []string{"RATELIMITD_MEMORY_LIMIT", "lots"}, "RATELIMITD_MEMORY_LIMIT"},
		{nil, []string{"RATELIMITD_GC_PERCENT", "-3"}, "--gc-percent=-3"},
	} {
		if _, _, err := Parse(c.args, env(c.env...), io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err %v, want it to name %s", c.args, c.env, err, c.want)
		}
	}
}

// TestEnvTwinNamedInErrors: a bad value set through a RATELIMITD_* twin is
// reported with the variable's name, and not when the command line
// overrides it.
func TestEnvTwinNamedInErrors(t *testing.T) {
	env := map[string]string{"RATELIMITD_REDIS_PIPELINES": "-1", "RATELIMITD_LOG_LEVEL": "loud"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	_, _, err := Parse([]string{"--config", "x.yaml"}, lookup, io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--redis-pipelines=-1", "(set by RATELIMITD_REDIS_PIPELINES)", "(set by RATELIMITD_LOG_LEVEL)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	_, _, err = Parse([]string{"--config", "x.yaml", "--log-level", "loud2", "--redis-pipelines", "2"}, lookup, io.Discard)
	if err == nil || strings.Contains(err.Error(), "set by") || !strings.Contains(err.Error(), "loud2") {
		t.Errorf("command-line values: error %v, want one naming loud2 and no variable", err)
	}
}
