package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// memoryStore returns a memory store with the default options, closed
// when t ends.
func memoryStore(t testing.TB) *memory.Store {
	t.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	return mem
}

// newTestService returns service.New(o), failing t on an error.
func newTestService(t testing.TB, o service.Options) *service.Service {
	t.Helper()
	svc, err := service.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// writeTestFile writes s to the file p (mode 0600, readable by the test's
// user only, as secret files must be), failing t on an error.
func writeTestFile(t testing.TB, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// setConfig loads cfg, the YAML of one config file, as policy.Load loads a
// file and puts it in force in svc.
func setConfig(t testing.TB, svc *service.Service, cfg string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rl.yaml")
	writeTestFile(t, file, cfg)
	set, _, err := policy.Load(policy.LoadOptions{}, file)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetPolicy(set)
}

// counterByLabel returns the counters of the metric name in reg summed by
// the value of their label label (series without it are left out).
func counterByLabel(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// env is a lookup over the name, value pairs kv.
func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// cgroupOf fakes the cgroup memory limit read.
func cgroupOf(n uint64, err error) func() (uint64, error) {
	return func() (uint64, error) { return n, err }
}
