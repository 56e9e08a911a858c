package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// versionConfig is domain v<n> with rules rules (one key, values r0 …).
func versionConfig(n, rules int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: v%d\ndescriptors:\n", n)
	for i := range rules {
		fmt.Fprintf(&b, "  - key: k\n    value: r%d\n    rate_limit: {unit: second, requests_per_unit: %d}\n", i, i+1)
	}
	return b.String()
}

// applied is one Set a watcher delivered.
type applied struct {
	version int  // n of domain v<n>; -1 if the Set is not one domain v<n>
	rules   int  // len(Set.Rules())
	during  bool // received while the writer was still writing
}

// recorder runs Watch and records every Set applied and error failed,
// without ever blocking the watcher.
type recorder struct {
	mu      sync.Mutex
	sets    []applied
	errs    []error
	writing atomic.Bool
}

func record(t *testing.T, path string) *recorder {
	t.Helper()
	r := &recorder{}
	r.writing.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, LoadOptions{}, []string{path}, func(s *Set, _ []Warning) {
			a := applied{version: -1, rules: len(s.Rules()), during: r.writing.Load()}
			if d := s.Domains(); len(d) == 1 && strings.HasPrefix(d[0], "v") {
				if n, err := strconv.Atoi(d[0][1:]); err == nil {
					a.version = n
				}
			}
			r.mu.Lock()
			r.sets = append(r.sets, a)
			r.mu.Unlock()
		}, func(err error) {
			r.mu.Lock()
			r.errs = append(r.errs, err)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return r
}

func (r *recorder) snapshot() ([]applied, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]applied(nil), r.sets...), append([]error(nil), r.errs...)
}

// waitLast polls until the last Set applied is version v.
func (r *recorder) waitLast(t *testing.T, v int) []applied {
	t.Helper()
	deadline := time.Now().Add(reloadBound)
	for {
		sets, errs := r.snapshot()
		if len(sets) > 0 && sets[len(sets)-1].version == v {
			return sets
		}
		if time.Now().After(deadline) {
			t.Fatalf("version %d not in force within %v; applied %v, errors %v", v, reloadBound, sets, errs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFirst waits for the first load (version 0).
func (r *recorder) waitFirst(t *testing.T) { t.Helper(); r.waitLast(t, 0) }

// writeFor calls write(n) with n = 1, 2, … every interval for d, then
// marks writing done; it returns the last n.
func (r *recorder) writeFor(d, interval time.Duration, write func(n int)) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		n++
		write(n)
		time.Sleep(interval)
	}
	r.writing.Store(false)
	return n
}

// watched writes version 0 of a config of rules rules (versionConfig)
// to a new file and returns its path and a recorder watching it that has
// seen the first Set.
func watched(t *testing.T, rules int) (string, *recorder) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	write(t, p, versionConfig(0, rules))
	r := record(t, p)
	r.waitFirst(t)
	return p, r
}

// frozenWatched writes version 0 of a config of rules rules (versionConfig)
// to a new file and returns its path and a watcher of it on a frozen
// manual clock that has applied version 0.
func frozenWatched(t *testing.T, rules int) (string, *watcher) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	write(t, p, versionConfig(0, rules))
	clk := clock.NewManual()
	clk.Freeze()
	w := startWatchConfig(t, watchConfig{paths: []string{p}, clock: clk})
	w.waitSet(t, "v0")
	return p, w
}

// writeEvery calls write(n) with n = 1, 2, … for d of the watcher's
// (frozen manual) clock: after each it waits until the write's events in
// dir have reached the watcher and moves the clock on by interval. It
// returns the last n and the time the writes ended.
func (w *watcher) writeEvery(t *testing.T, dir string, d, interval time.Duration, write func(n int)) (int, time.Time) {
	t.Helper()
	n := 0
	for start := w.clock.Now(); w.clock.Now().Sub(start) < d; {
		n++
		write(n)
		w.sync(t, dir)
		w.advance(t, interval)
	}
	return n, w.clock.Now()
}

// settled waits until every event in dir has reached the watcher and it
// has nothing scheduled, and returns the Sets applied after version 0
// (during: applied before end) and the errors failed.
func (w *watcher) settled(t *testing.T, dir string, end time.Time) ([]applied, []error) {
	t.Helper()
	w.sync(t, dir)
	w.settle(t)
	var sets []applied
	var errs []error
	for _, o := range w.outcomes()[1:] {
		if o.err != nil {
			errs = append(errs, o.err)
			continue
		}
		sets = append(sets, applied{version: setVersion(o.set), rules: len(o.set.Rules()), during: o.at.Before(end)})
	}
	return sets, errs
}

// TestWatchContinuousReplaceConverges: a config replaced (write-then-rename)
// every 20 ms for 3 s has intermediate versions applied while the writes
// go on (the maximum wait), and the last version is in force once they
// stop; every Set applied is a complete version, in increasing order. The
// writes are 20 ms apart on the watcher's frozen manual clock.
func TestWatchContinuousReplaceConverges(t *testing.T) {
	p, w := frozenWatched(t, 5)
	last, end := w.writeEvery(t, filepath.Dir(p), 3*time.Second, 20*time.Millisecond, func(n int) { replace(t, p, versionConfig(n, 5)) })
	sets, errs := w.settled(t, filepath.Dir(p), end)
	if len(sets) == 0 || sets[len(sets)-1].version != last || len(errs) != 0 {
		t.Fatalf("version %d not in force once the writes stopped; applied %v, errors %v", last, sets, errs)
	}
	checkApplied(t, sets, 5)
	during := 0
	for _, a := range sets {
		if a.during && a.version > 0 {
			during++
		}
	}
	if during == 0 {
		t.Errorf("no version applied during 3 s of writes (%d writes); applied %v", last, sets)
	}
	t.Logf("%d writes, %d Sets applied, %d of them during the writes", last, len(sets), during)
}

// TestWatchContinuousInPlaceConverges: a config rewritten in place
// (truncate, write) every 20 ms for 2 s is never applied empty or partial,
// and the last version is in force once the writes stop. It runs on the
// system clock, end to end: the writer's pace is the host's, and only the
// outcome is asserted.
func TestWatchContinuousInPlaceConverges(t *testing.T) {
	p, r := watched(t, 20)
	last := r.writeFor(2*time.Second, 20*time.Millisecond, func(n int) { write(t, p, versionConfig(n, 20)) })
	checkApplied(t, r.waitLast(t, last), 20)
}

// TestWatchHalfWrittenNeverApplied: a file written in two halves (each
// half a valid config: the first half of the rules) with a 20 ms pause,
// over and over for 3 s, is never applied half, also when the maximum wait
// forces loads during the writes. The pause and the writes' spacing are
// on the watcher's frozen manual clock.
func TestWatchHalfWrittenNeverApplied(t *testing.T) {
	p, w := frozenWatched(t, 40)
	dir := filepath.Dir(p)
	last, end := w.writeEvery(t, dir, 3*time.Second, 10*time.Millisecond, func(n int) {
		full := versionConfig(n, 40)
		half := versionConfig(n, 20) // a prefix of full, and a valid config
		if !strings.HasPrefix(full, half) {
			t.Fatal("half is not a prefix")
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(half); err != nil {
			t.Fatal(err)
		}
		w.sync(t, dir)
		w.advance(t, 20*time.Millisecond)
		if _, err := f.WriteString(full[len(half):]); err != nil {
			t.Fatal(err)
		}
	})
	sets, errs := w.settled(t, dir, end)
	if len(sets) == 0 || sets[len(sets)-1].version != last || len(errs) != 0 {
		t.Fatalf("version %d not in force once the writes stopped; applied %v, errors %v", last, sets, errs)
	}
	checkApplied(t, sets, 40)
}

// TestWatchInvalidAfterWritesKeepsValid: continuous valid writes, then an
// invalid version: the invalid one is reported and never applied, a
// version written during the writes stays in force.
func TestWatchInvalidAfterWritesKeepsValid(t *testing.T) {
	p, w := frozenWatched(t, 5)
	_, end := w.writeEvery(t, filepath.Dir(p), 2*time.Second, 20*time.Millisecond, func(n int) { replace(t, p, versionConfig(n, 5)) })
	replace(t, p, "domain: bad\nbogus: 1\n")
	sets, errs := w.settled(t, filepath.Dir(p), end)
	if len(errs) == 0 || !strings.Contains(errs[len(errs)-1].Error(), `unknown key "bogus"`) {
		t.Fatalf("the invalid version was not reported: errors %v", errs)
	}
	checkApplied(t, sets, 5)
	if len(sets) == 0 || sets[len(sets)-1].version <= 0 {
		t.Errorf("no version written during the writes in force; applied %v", sets)
	}
}

// checkApplied: every Set applied is a complete version (domain v<n>, rules
// rules), versions never go back.
func checkApplied(t *testing.T, sets []applied, rules int) {
	t.Helper()
	prev := -1
	for i, a := range sets {
		if a.version < 0 || a.rules != rules {
			t.Errorf("Set %d applied is not a complete version: %+v (want %d rules)", i, a, rules)
		}
		if a.version < prev {
			t.Errorf("Set %d applied is version %d after version %d", i, a.version, prev)
		}
		prev = a.version
	}
}
