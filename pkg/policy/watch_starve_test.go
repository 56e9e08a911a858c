package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadLog runs Watch on path and records when each Set was applied (its
// version, as versionConfig names it) and each error reported.
type loadLog struct {
	mu   sync.Mutex
	sets []timedSet
	errs []error
}

type timedSet struct {
	version, rules int
	at             time.Time
}

func watchLog(t *testing.T, opts LoadOptions, path string) *loadLog {
	t.Helper()
	l := &loadLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, opts, []string{path}, func(s *Set, _ []Warning) {
			ts := timedSet{version: -1, rules: len(s.Rules()), at: time.Now()}
			if d := s.Domains(); len(d) == 1 && strings.HasPrefix(d[0], "v") {
				if n, err := strconv.Atoi(d[0][1:]); err == nil {
					ts.version = n
				}
			}
			l.mu.Lock()
			l.sets = append(l.sets, ts)
			l.mu.Unlock()
		}, func(err error) {
			l.mu.Lock()
			l.errs = append(l.errs, err)
			l.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return l
}

func (l *loadLog) snapshot() ([]timedSet, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]timedSet(nil), l.sets...), append([]error(nil), l.errs...)
}

// waitFor polls until ok holds for the sets and errors recorded.
func (l *loadLog) waitFor(t *testing.T, what string, ok func([]timedSet, []error) bool) {
	t.Helper()
	deadline := time.Now().Add(reloadBound)
	for {
		sets, errs := l.snapshot()
		if ok(sets, errs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; applied %v, errors %v", what, reloadBound, sets, errs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writePattern is one way of changing a config: write(n, content) puts
// content in force at the path the watcher watches.
type writePattern struct {
	name  string
	setup func(t *testing.T) (path string, opts LoadOptions, write func(content string))
}

var writePatterns = []writePattern{
	{"inplace", func(t *testing.T) (string, LoadOptions, func(string)) {
		p := filepath.Join(t.TempDir(), "config.yaml")
		return p, LoadOptions{}, func(c string) { write(t, p, c) }
	}},
	{"rename", func(t *testing.T) (string, LoadOptions, func(string)) {
		p := filepath.Join(t.TempDir(), "config.yaml")
		return p, LoadOptions{}, func(c string) { replace(t, p, c) }
	}},
	{"symlink", func(t *testing.T) (string, LoadOptions, func(string)) {
		// A Kubernetes ConfigMap volume: config.yaml -> ..data/config.yaml,
		// ..data -> a timestamped directory, swapped by a rename and the
		// old directory removed.
		dir := t.TempDir()
		n := 0
		write := func(c string) {
			n++
			ts := fmt.Sprintf("..2026_12_06_%06d", n)
			if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, ts, "config.yaml"), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
			old, _ := os.Readlink(filepath.Join(dir, "..data"))
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(ts, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			if old != "" {
				if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, "config.yaml"), LoadOptions{IgnoreDotFiles: true}, write
	}},
}

// TestWatchLoadsDuringContinuousWrites: a config changed every 10, 50 or
// 100 ms for 3 s, in place, by rename or by a ConfigMap symlink swap, with
// the last write invalid, is loaded while the writes go on (at least 2
// loads in 3 s, though they come about a second apart), every Set applied
// is a complete version in increasing order, and once the invalid last
// write is reported the version in force was written within the last
// second of valid writes.
func TestWatchLoadsDuringContinuousWrites(t *testing.T) {
	for _, p := range writePatterns {
		for _, every := range []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", p.name, every), func(t *testing.T) {
				t.Parallel()
				path, opts, put := p.setup(t)
				put(versionConfig(0, 5))
				l := watchLog(t, opts, path)
				l.waitFor(t, "version 0", func(s []timedSet, _ []error) bool { return len(s) > 0 && s[len(s)-1].version == 0 })

				var written []time.Time // written[n]: when version n was in place
				written = append(written, time.Now())
				start := time.Now()
				for n := 1; time.Since(start) < 3*time.Second; n++ {
					put(versionConfig(n, 5))
					written = append(written, time.Now())
					time.Sleep(every)
				}
				lastValid := len(written) - 1
				put("domain: bad\nbogus: 1\n")
				end := time.Now()
				l.waitFor(t, "the invalid last write reported", func(_ []timedSet, errs []error) bool {
					return len(errs) > 0 && strings.Contains(errs[len(errs)-1].Error(), `unknown key "bogus"`)
				})
				// A Set applied after the error would be a load of the
				// invalid version's predecessor read late: none may follow.
				time.Sleep(2 * watchDebounce)
				sets, _ := l.snapshot()

				during, prev, maxGap := 0, start, time.Duration(0)
				for i, s := range sets {
					if s.version < 0 || s.rules != 5 {
						t.Errorf("Set %d applied is not a complete version: %+v", i, s)
					}
					if i > 0 && s.version < sets[i-1].version {
						t.Errorf("Set %d applied is version %d after version %d", i, s.version, sets[i-1].version)
					}
					if s.version > 0 && s.at.Before(end) {
						during++
						maxGap = max(maxGap, s.at.Sub(prev))
						prev = s.at
					}
				}
				if during < 2 {
					t.Errorf("%d Sets applied during 3 s of writes (%d writes), want at least 2; applied %v", during, lastValid, sets)
				}
				inForce := sets[len(sets)-1].version
				if inForce <= 0 || inForce > lastValid {
					t.Fatalf("version in force %d, want one of the writes 1..%d", inForce, lastValid)
				}
				if age := written[lastValid].Sub(written[inForce]); age > time.Second {
					t.Errorf("version in force %d was written %v before the last valid write %d: older than the last second of writes", inForce, age, lastValid)
				}
				t.Logf("%d writes, %d Sets applied during them (longest gap %v), version %d in force (last valid %d)", lastValid, during, maxGap, inForce, lastValid)
			})
		}
	}
}

// TestGrows: a read that extends the previous one (the same files, each
// starting with its earlier content) is the same version still being
// written; anything else is another version.
func TestGrows(t *testing.T) {
	src := func(files ...string) sources {
		var s sources
		for i := 0; i+1 < len(files); i += 2 {
			s.files = append(s.files, sourceFile{name: files[i], data: []byte(files[i+1])})
		}
		return s
	}
	for _, c := range []struct {
		prev, next sources
		want       bool
	}{
		{src("a", ""), src("a", "domain: x\n"), true},
		{src("a", "domain: x\n"), src("a", "domain: x\ndescriptors: []\n"), true},
		{src("a", "domain: x\n", "b", "d"), src("a", "domain: x\n", "b", "domain: y\n"), true},
		{src("a", "domain: x\n"), src("a", ""), false},
		{src("a", "domain: v1\n"), src("a", "domain: v2\n"), false},
		{src("a", "domain: x\n"), src("b", "domain: x\n"), false},
		{src("a", "domain: x\n"), src("a", "domain: x\n", "b", ""), false},
	} {
		if got := grows(c.prev, c.next); got != c.want {
			t.Errorf("grows(%v, %v) = %v, want %v", c.prev, c.next, got, c.want)
		}
	}
}
