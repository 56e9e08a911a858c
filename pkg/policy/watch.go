package policy

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce is how long Watch waits after the last file event before
// reloading: editors and Kubernetes write several entries per change.
const watchDebounce = 150 * time.Millisecond

// Watch loads paths, then reloads whenever a file or directory under them
// changes (fsnotify on directories; Kubernetes ..data symlink swaps and
// write-then-rename editors included). It calls apply with each good Set
// and fail with each load error (the previous Set stays in force). The
// first load's result is delivered before Watch blocks. Watch returns when
// ctx is done.
//
// Watching: every directory given, and every subdirectory below it (dot
// directories skipped with IgnoreDotFiles), plus the parent directory of
// every file given, so a file replaced by rename or a symlink swapped in
// its directory is seen. Events are debounced (about 150 ms after the
// last one), so a change is in effect well within 2 s. apply and fail run
// on Watch's goroutine, one at a time. The returned error is non-nil only
// when the watcher cannot be set up (then after the first load's result
// was delivered) or ctx ends (ctx.Err()).
func Watch(ctx context.Context, opts LoadOptions, paths []string, apply func(*Set, []Warning), fail func(error)) error {
	load := func() {
		s, warns, err := Load(opts, paths...)
		if err != nil {
			fail(err)
			return
		}
		apply(s, warns)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		load()
		return fmt.Errorf("policy: watch: %w", err)
	}
	defer w.Close()
	watched := map[string]bool{}
	addWatches := func() error {
		var firstErr error
		add := func(dir string) {
			if watched[dir] {
				return
			}
			if err := w.Add(dir); err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			watched[dir] = true
		}
		for _, root := range paths {
			st, err := os.Stat(root)
			if err != nil || !st.IsDir() {
				add(filepath.Dir(root))
				continue
			}
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				if p != root && opts.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				add(p)
				return nil
			})
		}
		return firstErr
	}
	// Watch first, then load, so a change between the two is not lost.
	setupErr := addWatches()
	load()
	if setupErr != nil && len(watched) == 0 {
		return fmt.Errorf("policy: watch: %w", setupErr)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("policy: watch: event channel closed")
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				// fsnotify drops watches of removed directories.
				if watched[ev.Name] {
					delete(watched, ev.Name)
					_ = w.Remove(ev.Name)
				}
			}
			timer.Reset(watchDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("policy: watch: error channel closed")
			}
			fail(fmt.Errorf("policy: watch: %w", err))
		case <-timer.C:
			_ = addWatches() // new subdirectories
			load()
		}
	}
}
