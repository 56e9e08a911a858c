package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// missingDirBound is generous: the directories appear one reload each
// before the config does (docs/config.md: within 1 s each).
const missingDirBound = 20 * time.Second

// TestWatchMissingParent: a config path two levels below a directory that
// does not exist keeps Watch running (the first load fails), and the
// config loads once the directories and the file appear: created at once
// (mkdir -p), as a directory of YAML files, or as a Kubernetes ConfigMap
// (..data symlink swap) in a directory created later.
func TestWatchMissingParent(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing", "sub", "config")
		w := startWatch(t, LoadOptions{}, path)
		w.waitErr(t, "no such file")
		mkdirAll(t, filepath.Dir(path))
		write(t, path, "domain: one\n")
		w.waitSetWithin(t, "one", missingDirBound)
	})
	t.Run("dir", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing", "sub", "config")
		w := startWatch(t, LoadOptions{}, path)
		w.waitErr(t, "no such file")
		mkdirAll(t, path)
		write(t, filepath.Join(path, "a.yaml"), "domain: one\n")
		w.waitSetWithin(t, "one", missingDirBound)
	})
	t.Run("configmap", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "missing", "sub")
		path := filepath.Join(dir, "config.yaml")
		w := startWatch(t, LoadOptions{IgnoreDotFiles: true}, path)
		w.waitErr(t, "no such file")
		mkdirAll(t, filepath.Join(dir, "..2026_12_02_01"))
		write(t, filepath.Join(dir, "..2026_12_02_01", "config.yaml"), "domain: one\n")
		symlink(t, "..2026_12_02_01", filepath.Join(dir, "..data_tmp"))
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		symlink(t, filepath.Join("..data", "config.yaml"), path)
		w.waitSetWithin(t, "one", missingDirBound)
	})
}

// TestWatchMissingParentStepwise: the watch moves down one directory at a
// time: the nearest existing ancestor is watched, and each directory
// created is a relevant event seen on its parent's watch, which then
// gives way to the new directory's.
func TestWatchMissingParentStepwise(t *testing.T) {
	root := canonDir(t.TempDir())
	a := filepath.Join(root, "a")
	b := filepath.Join(a, "b")
	path := filepath.Join(b, "config")
	events := make(chan fsnotify.Event, 1000)
	fsw := make(chan *fsnotify.Watcher, 1)
	w := startWatchConfig(t, watchConfig{
		paths:     []string{path},
		onWatcher: func(x *fsnotify.Watcher) { fsw <- x },
		onEvent: func(ev fsnotify.Event, relevant bool) {
			if relevant {
				select {
				case events <- ev:
				default:
				}
			}
		},
	})
	watcher := <-fsw
	w.waitErr(t, "no such file")
	// waitWatching waits until dir is the only directory watched (the
	// loop changes its watches only while it handles an event or its
	// timer, each followed by a step).
	waitWatching := func(dir string) {
		t.Helper()
		w.until(t, missingDirBound, "watching only "+dir, func() bool {
			list := watcher.WatchList()
			return len(list) == 1 && list[0] == dir
		})
	}
	waitCreate := func(name string) {
		t.Helper()
		deadline := time.After(missingDirBound)
		for {
			select {
			case ev := <-events:
				if ev.Has(fsnotify.Create) && filepath.Clean(ev.Name) == name {
					return
				}
			case <-deadline:
				t.Fatalf("no relevant Create of %s within %v", name, missingDirBound)
			}
		}
	}
	waitWatching(root)
	mkdirAll(t, a)
	waitCreate(a)
	waitWatching(a)
	mkdirAll(t, b)
	waitCreate(b)
	waitWatching(b)
	write(t, path, "domain: one\n")
	w.waitSetWithin(t, "one", missingDirBound)
}

// waitSetWithin is waitSet with its own bound; errors (the directories
// appear before the config) are ignored. On the manual clock it fires
// whatever timer the loop arms (debounces, stability checks, read-error
// retries) in turn, without waiting for the events of a change: the
// watch moves down the new directories one reload at a time, so any
// order of loads must end with the config in force.
func (w *watcher) waitSetWithin(t *testing.T, want string, bound time.Duration) {
	t.Helper()
	w.driveWithin(t, bound, fmt.Sprintf("a Set with domain %q", want), func(s *Set, _ error) bool {
		if s == nil {
			return false
		}
		got := s.Domains()
		return len(got) == 1 && got[0] == want
	})
}

func mkdirAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}
