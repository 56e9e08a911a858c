package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// watcher runs Watch in the background and exposes its callbacks.
type watcher struct {
	sets   chan *Set
	errs   chan error
	cancel context.CancelFunc
	done   chan error
}

func startWatch(t *testing.T, opts LoadOptions, paths ...string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{sets: make(chan *Set, 100), errs: make(chan error, 100), cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- Watch(ctx, opts, paths, func(s *Set, _ []Warning) { w.sets <- s }, func(err error) { w.errs <- err })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return w
}

// reloadBound is generous: the contract asks for 2 s; the debounce is
// 150 ms, but CI machines are shared.
const reloadBound = 10 * time.Second

// waitSet waits for an applied Set whose domains are want.
func (w *watcher) waitSet(t *testing.T, want string) *Set {
	t.Helper()
	start := time.Now()
	deadline := time.After(reloadBound)
	for {
		select {
		case s := <-w.sets:
			if strings.Join(s.Domains(), ",") == want {
				t.Logf("domains %q in effect after %v", want, time.Since(start))
				return s
			}
		case err := <-w.errs:
			t.Logf("reload error (may be transient): %v", err)
		case <-deadline:
			t.Fatalf("no Set with domains %q within %v", want, reloadBound)
		}
	}
}

func (w *watcher) waitErr(t *testing.T, contains string) {
	t.Helper()
	deadline := time.After(reloadBound)
	for {
		select {
		case s := <-w.sets:
			t.Fatalf("bad config applied: domains %v", s.Domains())
		case err := <-w.errs:
			if strings.Contains(err.Error(), contains) {
				return
			}
			t.Logf("other error: %v", err)
		case <-deadline:
			t.Fatalf("no error containing %q within %v", contains, reloadBound)
		}
	}
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchWriteBadChangeKeepsLastGood(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitSet(t, "one")
	write(t, filepath.Join(dir, "a.yaml"), "domain: two\nbogus: 1\n")
	w.waitErr(t, `a.yaml:2: unknown key "bogus"`)
	write(t, filepath.Join(dir, "a.yaml"), "domain: three\n")
	w.waitSet(t, "three")
	// A new subdirectory is watched too.
	if err := os.MkdirAll(filepath.Join(dir, "sub", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.waitSet(t, "three") // the mkdir itself triggers a reload
	write(t, filepath.Join(dir, "sub", "deep", "b.yaml"), "domain: four\n")
	w.waitSet(t, "four,three")
}

func TestWatchRenameIntoPlace(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitSet(t, "one")
	tmp := filepath.Join(dir, ".a.yaml.swp")
	write(t, tmp, "domain: two\n")
	if err := os.Rename(tmp, filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	w.waitSet(t, "two")
}

func TestWatchSingleFile(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	file := filepath.Join(dir, "a.yaml")
	w := startWatch(t, LoadOptions{}, file)
	w.waitSet(t, "one")
	tmp := filepath.Join(dir, "a.yaml.new")
	write(t, tmp, "domain: two\n")
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	w.waitSet(t, "two")
}

// TestWatchConfigMapSwap simulates a Kubernetes ConfigMap volume:
// dir/..<ts>/file.yaml, dir/..data -> ..<ts>, dir/file.yaml ->
// ..data/file.yaml; an update writes a new ..<ts> directory, points a
// temporary symlink at it, renames it over ..data and removes the old one.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mk := func(ts, content string) {
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, ts, "config.yaml"), content)
	}
	mk("..2026_11_30_01", "domain: one\n")
	if err := os.Symlink("..2026_11_30_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, LoadOptions{IgnoreDotFiles: true}, dir)
	w.waitSet(t, "one")

	swap := func(ts, content string) {
		mk(ts, content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(ts, tmp); err != nil {
			t.Fatal(err)
		}
		old, err := os.Readlink(filepath.Join(dir, "..data"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	swap("..2026_11_30_02", "domain: two\n")
	w.waitSet(t, "two")
	swap("..2026_11_30_03", "domain: [broken\n")
	w.waitErr(t, "config.yaml:1: YAML syntax error")
	swap("..2026_11_30_04", "domain: four\n")
	w.waitSet(t, "four")
}

func TestWatchInitialFailure(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: \"\"\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitErr(t, "empty domain")
	write(t, filepath.Join(dir, "a.yaml"), "domain: ok\n")
	w.waitSet(t, "ok")
}
