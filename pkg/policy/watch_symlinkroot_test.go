package policy

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWatchSymlinkedRootSwap: a config directory reached through a symlink
// above it (the reference's RUNTIME_ROOT=rr/current with
// RUNTIME_SUBDIRECTORY=ratelimit, rr/current -> v1) reloads when that
// symlink is swapped atomically to another tree (ln -s v2 rr/tmp && mv -T
// rr/tmp rr/current), as a directory or as a single file, and again when
// swapped back.
func TestWatchSymlinkedRootSwap(t *testing.T) {
	for _, file := range []bool{false, true} {
		name := "dir"
		if file {
			name = "file"
		}
		t.Run(name, func(t *testing.T) {
			rr := t.TempDir()
			for v, domain := range map[string]string{"v1": "eleven", "v2": "twentytwo"} {
				mkdirAll(t, filepath.Join(rr, v, "ratelimit", "config"))
				write(t, filepath.Join(rr, v, "ratelimit", "config", "a.yaml"), "domain: "+domain+"\n")
			}
			symlink(t, "v1", filepath.Join(rr, "current"))
			path := filepath.Join(rr, "current", "ratelimit", "config")
			if file {
				path = filepath.Join(path, "a.yaml")
			}
			w := startWatch(t, LoadOptions{IgnoreDotFiles: true}, path)
			w.waitSet(t, "eleven")
			swap := func(target string) {
				t.Helper()
				tmp := filepath.Join(rr, "tmp")
				symlink(t, target, tmp)
				if err := os.Rename(tmp, filepath.Join(rr, "current")); err != nil {
					t.Fatal(err)
				}
				w.sync(t, rr)
			}
			swap("v2")
			w.waitSet(t, "twentytwo")
			// The watch moved to v2's tree: an edit there reloads.
			write(t, filepath.Join(rr, "v2", "ratelimit", "config", "a.yaml"), "domain: edited\n")
			w.sync(t, filepath.Join(rr, "v2", "ratelimit", "config"))
			w.waitSet(t, "edited")
			swap("v1")
			w.waitSet(t, "eleven")
		})
	}
}
