package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// clock.Manual and clock.System are Clocks: Watch's tests move the
// first by hand.
var (
	_ Clock = (*clock.Manual)(nil)
	_ Clock = clock.System{}
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// watcher runs Watch in the background and exposes its callbacks. Its
// clock is a clock.Manual that waitSet and waitErr move on (fire) when
// the loop has armed its timer, unless the test runs it on real time.
type watcher struct {
	sets    chan *Set
	errs    chan error
	applies atomic.Int64 // apply calls
	fails   atomic.Int64 // fail calls
	cancel  context.CancelFunc
	done    chan error

	clock *clock.Manual // nil: the system clock
	// stepped signals (without blocking) that the loop is about to wait
	// again; timerSteps counts those after its timer, idle is the last
	// one's verdict (nothing scheduled), stepEvents the events handled by
	// then. events counts the events handled, names the last of them for
	// each base name; history is every Set applied and error failed, with
	// the watcher's clock's time.
	stepped    chan struct{}
	timerSteps atomic.Int64
	idle       atomic.Bool
	stepEvents atomic.Int64
	events     atomic.Int64
	mu         sync.Mutex
	names      map[string]int64
	syncs      int
	history    []outcome
}

// outcome is one call of apply (set) or fail (err) at the watcher's time.
type outcome struct {
	set *Set
	err error
	at  time.Time
}

// startWatch runs Watch on a manual clock.
func startWatch(t *testing.T, opts LoadOptions, paths ...string) *watcher {
	t.Helper()
	return startWatchConfig(t, watchConfig{opts: opts, paths: paths})
}

// startWatchConfig runs watch with c's options, paths and hooks (its apply
// and fail are the watcher's; its onEvent and onStep are called by the
// watcher's), on a new manual clock unless c.clock is set (a
// *clock.Manual given there is the one drive moves).
func startWatchConfig(t *testing.T, c watchConfig) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{
		sets: make(chan *Set, 1000), errs: make(chan error, 1000), cancel: cancel, done: make(chan error, 1),
		stepped: make(chan struct{}, 1), names: map[string]int64{},
	}
	if c.clock == nil {
		c.clock = clock.NewManual()
	}
	w.clock, _ = c.clock.(*clock.Manual)
	now := c.clock.Now
	c.apply = func(s *Set, _ []Warning) {
		w.applies.Add(1)
		w.mu.Lock()
		w.history = append(w.history, outcome{set: s, at: now()})
		w.mu.Unlock()
		w.sets <- s
	}
	c.fail = func(err error) {
		w.fails.Add(1)
		w.mu.Lock()
		w.history = append(w.history, outcome{err: err, at: now()})
		w.mu.Unlock()
		w.errs <- err
	}
	onEvent, onStep := c.onEvent, c.onStep
	c.onEvent = func(ev fsnotify.Event, relevant bool) {
		if onEvent != nil {
			onEvent(ev, relevant)
		}
		n := w.events.Add(1)
		w.mu.Lock()
		w.names[filepath.Base(ev.Name)] = n
		w.mu.Unlock()
	}
	c.onStep = func(timer, idle bool) {
		if onStep != nil {
			onStep(timer, idle)
		}
		w.idle.Store(idle)
		w.stepEvents.Store(w.events.Load())
		if timer {
			w.timerSteps.Add(1)
		}
		select {
		case w.stepped <- struct{}{}:
		default:
		}
	}
	go func() { w.done <- watch(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return w
}

// reloadBound bounds every wait for a reload. It is well above the 1 s
// docs/config.md ("Reload") promises, so that only a missing reload, not a
// slow one, fails a test.
const reloadBound = 10 * time.Second

// sync waits until every event made so far in dir, a directory the
// watcher watches, has reached the watcher: it makes one more there (a
// file no plan loads) and waits until the watcher has handled it and is
// about to wait again, as inotify delivers a watcher's events in order.
// A test calls it after a change and before it moves the clock, as real
// time would let the debounce wait for the change's last event.
func (w *watcher) sync(t *testing.T, dir string) {
	t.Helper()
	w.mu.Lock()
	w.syncs++
	name := fmt.Sprintf("sync-%d.txt", w.syncs)
	w.mu.Unlock()
	write(t, filepath.Join(dir, name), "")
	deadline := time.After(reloadBound)
	for {
		w.mu.Lock()
		n := w.names[name]
		w.mu.Unlock()
		if n > 0 && w.stepEvents.Load() >= n {
			return
		}
		select {
		case <-w.stepped:
		case <-deadline:
			t.Fatalf("the event of %s did not reach the watcher within %v", name, reloadBound)
		}
	}
}

// drive waits, up to reloadBound, until done accepts a Set applied or an
// error failed (each is given to done in turn). On the manual clock it
// moves the clock on whenever the loop has armed its timer: it fires the
// timer and waits until the loop has handled it before the next one.
func (w *watcher) drive(t *testing.T, what string, done func(*Set, error) bool) {
	t.Helper()
	w.driveWithin(t, reloadBound, what, done)
}

// driveWithin is drive with its own bound.
func (w *watcher) driveWithin(t *testing.T, bound time.Duration, what string, done func(*Set, error) bool) {
	t.Helper()
	deadline := time.After(bound)
	for {
		select {
		case s := <-w.sets:
			if done(s, nil) {
				return
			}
			continue
		case err := <-w.errs:
			if done(nil, err) {
				return
			}
			continue
		default:
		}
		if w.clock != nil {
			w.clock.Fire()
		}
		select {
		case s := <-w.sets:
			if done(s, nil) {
				return
			}
		case err := <-w.errs:
			if done(nil, err) {
				return
			}
		case <-w.stepped:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, bound)
		}
	}
}

// until waits, up to bound, until cond holds, checking it each time the
// loop is about to wait again; on the manual clock it fires the loop's
// timer whenever it is armed, as drive does. Sets and errors stay queued.
func (w *watcher) until(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(bound)
	for !cond() {
		if w.clock != nil {
			w.clock.Fire()
		}
		select {
		case <-w.stepped:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, bound)
		}
	}
}

// advance moves the manual clock on by d: it fires, in turn, each timer
// due by then and waits until the loop has handled it (the loop arms the
// next one while it does), then moves the clock to the end of d. The
// clock is frozen (clock.Manual.Freeze), so that only this moves it.
func (w *watcher) advance(t *testing.T, d time.Duration) {
	t.Helper()
	end := w.clock.Now().Add(d)
	for {
		at, ok := w.clock.Next()
		if !ok || at.After(end) {
			break
		}
		w.fire(t)
	}
	if rest := end.Sub(w.clock.Now()); rest > 0 {
		w.clock.Advance(rest)
	}
}

// fire fires the timer due first and waits until the loop has handled it.
func (w *watcher) fire(t *testing.T) {
	t.Helper()
	n := w.timerSteps.Load()
	if !w.clock.Fire() {
		t.Fatal("no timer of the watcher's clock armed")
	}
	deadline := time.After(reloadBound)
	for w.timerSteps.Load() == n {
		select {
		case <-w.stepped:
		case <-deadline:
			t.Fatalf("the watcher did not handle its timer within %v", reloadBound)
		}
	}
}

// settle fires the loop's timers until it has nothing scheduled (no burst
// pending, no read-error retry), after every event has reached it (sync).
func (w *watcher) settle(t *testing.T) {
	t.Helper()
	for i := 0; !w.idle.Load(); i++ {
		if i == 10000 {
			t.Fatal("the watcher still has a reload scheduled after 10000 timers")
		}
		w.fire(t)
	}
}

// outcomes returns every Set applied and error failed so far.
func (w *watcher) outcomes() []outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.history)
}

// waitSet waits for an applied Set whose domains are want.
func (w *watcher) waitSet(t *testing.T, want string) *Set {
	t.Helper()
	var got *Set
	w.drive(t, fmt.Sprintf("a Set with domains %q", want), func(s *Set, err error) bool {
		if err != nil {
			t.Logf("reload error (may be transient): %v", err)
			return false
		}
		if strings.Join(s.Domains(), ",") == want {
			got = s
			return true
		}
		return false
	})
	return got
}

// waitErr waits for an error containing contains; a Set applied
// meanwhile fails the test.
func (w *watcher) waitErr(t *testing.T, contains string) {
	t.Helper()
	w.drive(t, fmt.Sprintf("an error containing %q", contains), func(s *Set, err error) bool {
		if s != nil {
			t.Fatalf("bad config applied: domains %v", s.Domains())
		}
		if strings.Contains(err.Error(), contains) {
			return true
		}
		t.Logf("other error: %v", err)
		return false
	})
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
	w.sync(t, dir)
	w.waitErr(t, `a.yaml:2: unknown key "bogus"`)
	write(t, filepath.Join(dir, "a.yaml"), "domain: three\n")
	w.sync(t, dir)
	w.waitSet(t, "three")
	// A new subdirectory is watched too.
	if err := os.MkdirAll(filepath.Join(dir, "sub", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.sync(t, dir)
	w.waitSet(t, "three") // the mkdir itself triggers a reload
	write(t, filepath.Join(dir, "sub", "deep", "b.yaml"), "domain: four\n")
	w.sync(t, filepath.Join(dir, "sub", "deep"))
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
	w.sync(t, dir)
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
	w.sync(t, dir)
	w.waitSet(t, "two")
}

// TestWatchConfigMapSwap simulates a Kubernetes ConfigMap volume:
// dir/..<ts>/file.yaml, dir/..data -> ..<ts>, dir/file.yaml ->
// ..data/file.yaml; an update writes a new ..<ts> directory, points a
// temporary symlink at it, renames it over ..data and removes the old one.
// The realtime cases run Watch on the system clock, end to end: each
// change is in force (or reported) within reloadBound.
func TestWatchConfigMapSwap(t *testing.T) {
	t.Run("dir", func(t *testing.T) { testWatchConfigMapSwap(t, false, false) })
	t.Run("file", func(t *testing.T) { testWatchConfigMapSwap(t, true, false) })
	t.Run("realtime/dir", func(t *testing.T) { testWatchConfigMapSwap(t, false, true) })
	t.Run("realtime/file", func(t *testing.T) { testWatchConfigMapSwap(t, true, true) })
}

// testWatchConfigMapSwap gives Watch the ConfigMap directory, or with file
// its config.yaml (a symlink to ..data/config.yaml) directly; realtime
// runs it on the system clock.
func testWatchConfigMapSwap(t *testing.T, file, realtime bool) {
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
	path := dir
	if file {
		path = filepath.Join(dir, "config.yaml")
	}
	c := watchConfig{opts: LoadOptions{IgnoreDotFiles: true}, paths: []string{path}}
	if realtime {
		c.clock = systemClock{}
	}
	w := startWatchConfig(t, c)
	w.waitSet(t, "one")

	swap := func(ts, content string, keepOld bool) {
		defer w.sync(t, dir)
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
		if keepOld {
			return
		}
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	swap("..2026_11_30_02", "domain: two\n", false)
	w.waitSet(t, "two")
	swap("..2026_11_30_03", "domain: [broken\n", false)
	w.waitErr(t, "config.yaml:1: YAML syntax error")
	swap("..2026_11_30_04", "domain: four\n", false)
	w.waitSet(t, "four")
	// Only the ..data rename changes anything when the old directory
	// stays (it is removed later, or never).
	swap("..2026_11_30_05", "domain: five\n", true)
	w.waitSet(t, "five")
}

func TestWatchInitialFailure(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: \"\"\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitErr(t, "empty domain")
	write(t, filepath.Join(dir, "a.yaml"), "domain: ok\n")
	w.sync(t, dir)
	w.waitSet(t, "ok")
}

// replace writes content to a temporary file next to p (named p+".tmp",
// which neither a file watch nor a directory watch loads) and renames it
// over p: one relevant event, as editors and `kubectl cp` do.
func replace(t *testing.T, p, content string) {
	t.Helper()
	tmp := p + ".tmp"
	write(t, tmp, content)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// eventLog records Watch's verdict on every event, by base name.
type eventLog struct {
	mu       sync.Mutex
	seen     map[string]int
	relevant map[string]int
}

func newEventLog() *eventLog {
	return &eventLog{seen: map[string]int{}, relevant: map[string]int{}}
}

func (l *eventLog) record(ev fsnotify.Event, relevant bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := filepath.Base(ev.Name)
	l.seen[b]++
	if relevant {
		l.relevant[b]++
	}
}

// check fails unless every name in ignored had at least one event and
// none was relevant.
func (l *eventLog) check(t *testing.T, ignored ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range ignored {
		if l.seen[n] == 0 {
			t.Errorf("no event seen for %s (events: %v)", n, l.seen)
		}
		if l.relevant[n] != 0 {
			t.Errorf("%d of %d events on %s triggered a reload, want 0", l.relevant[n], l.seen[n], n)
		}
	}
}

// writeNeighbours writes, renames, removes and touches files that Watch
// must ignore; it returns their base names.
func writeNeighbours(t *testing.T, dir string, extra ...string) []string {
	t.Helper()
	logPath := filepath.Join(dir, "ratelimitd.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := f.WriteString(strings.Repeat("x", i%50) + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Log rotation: rename, then a new file.
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, logPath, "new\n")
	// An editor's swap file.
	swp := filepath.Join(dir, ".config.yaml.swp")
	write(t, swp, "domain: swp\n")
	if err := os.Remove(swp); err != nil {
		t.Fatal(err)
	}
	for _, n := range extra {
		write(t, filepath.Join(dir, n), "domain: "+strings.Trim(n, ".")+"\n")
	}
	return append([]string{"ratelimitd.log", "ratelimitd.log.1", ".config.yaml.swp"}, extra...)
}

// TestWatchFileIgnoresNeighbours: with a file given directly, writes to
// other files of its directory (a log file, its rotation, a swap file, a
// YAML file the loader does not read) and a touch (Chmod) of the file
// itself trigger no reload; a change renamed into place triggers exactly
// one.
func TestWatchFileIgnoresNeighbours(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write(t, file, "domain: one\n")
	ev := newEventLog()
	w := startWatchConfig(t, watchConfig{paths: []string{file}, onEvent: ev.record})
	w.waitSet(t, "one")
	ignored := writeNeighbours(t, dir, "other.yaml")
	now := time.Now()
	if err := os.Chtimes(file, now, now); err != nil {
		t.Fatal(err)
	}
	// The change is queued after every event above, so once it is in
	// force they have all been judged.
	replace(t, file, "domain: two\n")
	w.sync(t, dir)
	w.waitSet(t, "two")
	ev.check(t, append(ignored, "config.yaml.tmp")...)
	if a, f := w.applies.Load(), w.fails.Load(); a != 2 || f != 0 {
		t.Errorf("%d loads applied and %d failed, want 2 (first load, one change) and 0", a, f)
	}
}

// TestWatchDirLoaderRules: with a directory given, only files the loader
// would read count (.yaml/.yml, no dot files or dot directories with
// IgnoreDotFiles); a new config file triggers exactly one reload.
func TestWatchDirLoaderRules(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n", "sub/keep.txt": "x"})
	ev := newEventLog()
	w := startWatchConfig(t, watchConfig{opts: LoadOptions{IgnoreDotFiles: true}, paths: []string{dir}, onEvent: ev.record})
	w.waitSet(t, "one")
	ignored := writeNeighbours(t, dir, "notes.txt", ".hidden.yaml", "a.yaml.bak")
	write(t, filepath.Join(dir, "sub", "readme.md"), "hi\n")
	if err := os.Mkdir(filepath.Join(dir, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, ".git", "x.yaml"), "domain: git\n")
	now := time.Now()
	if err := os.Chtimes(filepath.Join(dir, "a.yaml"), now, now); err != nil {
		t.Fatal(err)
	}
	replace(t, filepath.Join(dir, "sub", "b.yml"), "domain: two\n")
	w.sync(t, dir)
	w.waitSet(t, "one,two")
	ev.check(t, append(ignored, "readme.md", ".git", "b.yml.tmp")...)
	if a, f := w.applies.Load(), w.fails.Load(); a != 2 || f != 0 {
		t.Errorf("%d loads applied and %d failed, want 2 (first load, one change) and 0", a, f)
	}
}

// TestWatchDotFilesLoaded: without IgnoreDotFiles a dot file is a config
// file like any other, and its changes reload.
func TestWatchDotFilesLoaded(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitSet(t, "one")
	replace(t, filepath.Join(dir, ".hidden.yaml"), "domain: hidden\n")
	w.sync(t, dir)
	w.waitSet(t, "hidden,one")
}

// TestWatchErrorReloads: a watcher error reaches fail as a *WatchError
// (not a read error, nor a config error) and is followed by a reload.
func TestWatchErrorReloads(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	fsw := make(chan *fsnotify.Watcher, 1)
	w := startWatchConfig(t, watchConfig{paths: []string{dir}, onWatcher: func(x *fsnotify.Watcher) { fsw <- x }})
	w.waitSet(t, "one")
	(<-fsw).Errors <- fsnotify.ErrEventOverflow
	select {
	case err := <-w.errs:
		var we *WatchError
		if !errors.As(err, &we) || !errors.Is(err, fsnotify.ErrEventOverflow) || IsReadError(err) {
			t.Fatalf("fail got %v (%T), want a *WatchError wrapping ErrEventOverflow", err, err)
		}
	case <-time.After(reloadBound):
		t.Fatalf("no watcher error within %v", reloadBound)
	}
	w.waitSet(t, "one") // the reload after the error
}

// TestWatchReadErrorRetried: a file given directly that is removed fails
// with read errors only, which Watch retries without any further event;
// the file's return is picked up.
func TestWatchReadErrorRetried(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write(t, file, "domain: one\n")
	w := startWatch(t, LoadOptions{}, file)
	w.waitSet(t, "one")
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	w.sync(t, dir)
	// One event (the removal), so a second error is a retry.
	for i := range 2 {
		w.drive(t, fmt.Sprintf("read error %d of 2 (the removal and a retry)", i), func(s *Set, err error) bool {
			if s != nil {
				t.Fatalf("set applied without a config file: %v", s.Domains())
			}
			if !IsReadError(err) || !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("error %d: %v, want a read error (not exist)", i, err)
			}
			return true
		})
	}
	replace(t, file, "domain: two\n")
	w.sync(t, dir)
	w.waitSet(t, "two")
}

// TestWatchRelativePaths: relative paths (the default --config is
// ./config) are matched against fsnotify's event names.
func TestWatchRelativePaths(t *testing.T) {
	dir := writeFiles(t, map[string]string{"config/a.yaml": "domain: one\n", "b.yaml": "domain: b\n"})
	t.Chdir(dir)
	ev := newEventLog()
	w := startWatchConfig(t, watchConfig{paths: []string{"./config", "b.yaml"}, onEvent: ev.record})
	w.waitSet(t, "b,one")
	write(t, "notes.txt", "x\n")
	write(t, filepath.Join("config", "notes.txt"), "x\n")
	replace(t, filepath.Join("config", "a.yaml"), "domain: two\n")
	w.sync(t, ".")
	w.waitSet(t, "b,two")
	replace(t, "b.yaml", "domain: c\n")
	w.sync(t, ".")
	w.waitSet(t, "c,two")
	ev.check(t, "notes.txt", "a.yaml.tmp", "b.yaml.tmp")
	if a := w.applies.Load(); a != 3 {
		t.Errorf("%d loads applied, want 3 (first load, two changes)", a)
	}
}

// TestWatchDebounceOnClock: the debounce and the stability check wait on
// the clock Watch is given, not on real time: with them widened to an
// hour, a change is in force as soon as the manual clock is moved past
// them, and the clock has moved on by the debounce and the settle
// (watchDebounce each, for an in-place write) at least.
func TestWatchDebounceOnClock(t *testing.T) {
	debounce, maxWait := watchDebounce, watchMaxWait
	watchDebounce, watchMaxWait = time.Hour, 3*time.Hour
	t.Cleanup(func() { watchDebounce, watchMaxWait = debounce, maxWait })
	dir := writeFiles(t, map[string]string{"a.yaml": "domain: one\n"})
	w := startWatch(t, LoadOptions{}, dir)
	w.waitSet(t, "one")
	start := w.clock.Now()
	write(t, filepath.Join(dir, "a.yaml"), "domain: two\n")
	w.sync(t, dir)
	w.waitSet(t, "two")
	if moved := w.clock.Now().Sub(start); moved < 2*time.Hour {
		t.Errorf("the clock moved %v to deliver an in-place write, want at least the debounce and the settle (2h)", moved)
	}
}

// String shows an outcome as the domains applied or the error, and when.
func (o outcome) String() string {
	at := o.at.Format("15:04:05.000")
	if o.err != nil {
		return fmt.Sprintf("%s error %v", at, o.err)
	}
	return fmt.Sprintf("%s applied %v", at, o.set.Domains())
}
