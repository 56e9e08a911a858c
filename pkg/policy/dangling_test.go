package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadSkipsDanglingSymlink: a dangling symlink in a config directory is
// skipped with a warning naming it, and the other files load; when it is
// the only config file there is nothing to load instead, and the load
// fails (a read error, so the config in force stays).
func TestLoadSkipsDanglingSymlink(t *testing.T) {
	dir := writeFiles(t, map[string]string{"good.yaml": "domain: one\n"})
	link := filepath.Join(dir, "gone.yaml")
	symlink(t, "nowhere.yaml", link)
	s, warns, err := Load(LoadOptions{}, dir)
	if err != nil {
		t.Fatalf("a dangling symlink beside a good file: %v", err)
	}
	if got := strings.Join(s.Domains(), ","); got != "one" {
		t.Errorf("domains %q, want one", got)
	}
	found := false
	for _, w := range warns {
		found = found || (w.File == link && strings.Contains(w.Message, "dangling symlink"))
	}
	if !found {
		t.Errorf("no warning naming %s as a dangling symlink: %v", link, warns)
	}

	only := t.TempDir()
	symlink(t, "nowhere.yaml", filepath.Join(only, "a.yaml"))
	if _, _, err := Load(LoadOptions{}, only); err == nil || !IsReadError(err) {
		t.Errorf("only a dangling symlink: %v, want a read error", err)
	}
	// Given directly, a dangling symlink is a missing file: an error.
	if _, _, err := Load(LoadOptions{}, link); err == nil || !IsReadError(err) {
		t.Errorf("dangling symlink given directly: %v, want a read error", err)
	}
}

// TestWatchDanglingSymlinkDoesNotBlock: with a dangling symlink in the
// watched directory, a new valid file still reloads.
func TestWatchDanglingSymlinkDoesNotBlock(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitSet(t, "one")
	symlink(t, "nowhere.yaml", filepath.Join(dir, "gone.yaml"))
	write(t, filepath.Join(dir, "b.yaml"), "domain: two\n")
	w.waitSet(t, "one,two")
	if err := os.Remove(filepath.Join(dir, "gone.yaml")); err != nil {
		t.Fatal(err)
	}
}
