package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// TestReloadMissingParentDir: serve's watcher with --config two levels
// below a directory that does not exist (reference mode's
// /srv/runtime_data/current/config before its volume is mounted) keeps
// running with no config in force (a read error), and the config loads
// once the directories and the file appear.
func TestReloadMissingParentDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runtime_data", "current", "config")
	e := newReloadEnv(t, policy.LoadOptions{}, path)
	e.waitReloads(t, "read_error", 1)
	if e.s.svc.Ready() {
		t.Fatal("ready with no config loaded")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, path, userConfig(100))
	e.waitReloads(t, "success", 1)
	if !e.s.svc.Ready() {
		t.Error("not ready after the config loaded")
	}
	if got := e.rpu(t); got != 100 {
		t.Errorf("requests_per_unit in force %d, want 100", got)
	}
}
