package policy

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce is how long Watch waits after the last relevant file event
// before reloading: editors and Kubernetes write several entries per
// change. watchMaxWait bounds the wait from a burst's start, so that files
// rewritten continuously are still sampled (watchSampleEvery apart) and
// loaded. Variables so that a test can widen them.
var (
	watchDebounce    = 150 * time.Millisecond
	watchMaxWait     = 500 * time.Millisecond
	watchSampleEvery = 5 * time.Millisecond
)

// watchSampleGap bounds the time from the start of the last read that
// returned a version to the end of the read that shows it replaced, for
// that replacement to prove the version complete: a state of the files
// that lasts watchSampleGap or longer (the rest of a file written in parts
// with a pause) cannot fall between two such reads unseen. Writes 10 ms
// apart or more are each seen.
const watchSampleGap = 10 * time.Millisecond

// Before a reload is delivered, the files are read twice, settle apart, and
// the two reads must hash the same (else the second read is the new first
// one and the check repeats). settle is watchDebounce when the burst
// wrote a config file in place (a writer may pause mid-file), and
// watchSettleReplace when files were only created, renamed or removed
// (each one complete when it appears).
const watchSettleReplace = 10 * time.Millisecond

// A load that fails with read errors only (IsReadError) is retried after
// readRetryDelay, doubling, up to readRetries times (0.25 s … 4 s, about
// 8 s in all), unless a relevant event comes first: a file replaced while
// it was read produces no further event.
const (
	readRetryDelay = 250 * time.Millisecond
	readRetries    = 5
)

// Watch loads paths, then reloads them whenever a config file changes
// (ConfigMap symlink swaps included), until ctx is done. It calls apply
// with every good Set and fail with every load or watcher error, one at a
// time on Watch's goroutine; the previous Set stays in force after a
// failure, so a bad edit never replaces a good config. A burst of changes
// is debounced and delivered only once two reads agree, so a half-written
// file is never loaded. The error is non-nil only when the watcher cannot
// be set up or ctx ends.
func Watch(ctx context.Context, opts LoadOptions, paths []string, apply func(*Set, []Warning), fail func(error), wopts ...WatchOption) error {
	c := watchConfig{opts: opts, paths: paths, apply: apply, fail: fail}
	for _, o := range wopts {
		o(&c)
	}
	return watch(ctx, c)
}

// A WatchOption changes how Watch runs.
type WatchOption func(*watchConfig)

// WatchClock makes Watch read the time and wait (the debounce, the
// stability check, the read-error retries, the samples past a burst's
// maximum wait) on c instead of the system clock: a test's manual clock
// moves the watcher on without waiting for real time to pass.
func WatchClock(c Clock) WatchOption { return func(w *watchConfig) { w.clock = c } }

// A Clock tells the time and makes the timer Watch waits on. Its Timer is
// the same interface type as the Timer of pkg/backend/clock, so that
// clock.Manual and clock.System are Clocks (this package may not import
// that one).
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// NewTimer makes a timer that fires after d.
	NewTimer(d time.Duration) Timer
}

// A Timer is the part of *time.Timer Watch uses.
type Timer = interface {
	// C is the channel the timer sends the time on when it fires.
	C() <-chan time.Time
	// Reset arms the timer again to fire after d, as time.Timer.Reset.
	Reset(d time.Duration) bool
	// Stop keeps the timer from firing, as time.Timer.Stop.
	Stop() bool
}

// systemClock is time.Now and time.NewTimer.
type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }

// watchConfig is Watch's input plus test hooks (nil in production).
type watchConfig struct {
	opts  LoadOptions
	paths []string
	apply func(*Set, []Warning)
	fail  func(error)
	clock Clock // nil: the system clock

	// onWatcher is called with the watcher before the first load.
	onWatcher func(*fsnotify.Watcher)
	// onEvent is called for every event received, with its verdict,
	// once it is handled (a relevant one has armed the timer).
	onEvent func(ev fsnotify.Event, relevant bool)
	// onStep is called each time the loop is about to wait again, with
	// whether it has just handled its timer (not an event or a watcher
	// error) and whether it has nothing scheduled: no burst pending and
	// no read-error retry.
	onStep func(timer, idle bool)
}

// watchLoop is the state of one Watch: the file watcher and the directories
// it watches, the plan of the last load, the read-error retries, and the
// burst of events being debounced.
type watchLoop struct {
	c       watchConfig
	w       *fsnotify.Watcher
	watched map[string]bool
	plan    *watchPlan
	timer   Timer
	// readErr: the last load failed with read errors only (retried).
	// retrying: a retry is armed.
	readErr  bool
	retries  int
	retrying bool

	// A burst is the relevant events since the last delivered reload:
	// pending from its first event (burstStart) until a reload delivers.
	// probe is the hash of the first read of a stability check under way
	// ("" when none is); inPlace records an in-place write in the burst.
	pending    bool
	burstStart time.Time
	probe      string
	inPlace    bool

	// lastLoad is when the last load was delivered. sampling: the burst
	// passed its maximum wait and the files are being read every
	// watchSampleEvery (sampleFiles) until a complete version is seen;
	// prev is the last read, first seen at prevSince.
	lastLoad  time.Time
	sampling  bool
	prev      *snapshot
	prevSince time.Time
	// prevLast is when the last read that returned prev began.
	prevLast time.Time
}

// snapshot is one read of the config files and the problems reading them.
type snapshot struct {
	src  sources
	errs *errList
}

func watch(ctx context.Context, c watchConfig) error {
	if c.clock == nil {
		c.clock = systemClock{}
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		(&watchLoop{c: c}).load("")
		return fmt.Errorf("policy: watch: %w", err)
	}
	defer fw.Close()
	if c.onWatcher != nil {
		c.onWatcher(fw)
	}
	w := &watchLoop{c: c, w: fw, watched: map[string]bool{}}
	var setupErr error
	w.readErr, _, _, setupErr = w.reload("")
	if setupErr != nil && len(w.watched) == 0 {
		return fmt.Errorf("policy: watch: %w", setupErr)
	}
	w.timer = c.clock.NewTimer(time.Hour)
	w.timer.Stop()
	defer w.timer.Stop()
	w.scheduleRetry()
	for timer := false; ; {
		if c.onStep != nil {
			c.onStep(timer, !w.pending && !w.retrying)
		}
		timer = false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-fw.Events:
			if !ok {
				return fmt.Errorf("policy: watch: event channel closed")
			}
			w.onEvent(ev)
		case err, ok := <-fw.Errors:
			if !ok {
				return fmt.Errorf("policy: watch: error channel closed")
			}
			c.fail(&WatchError{Err: err})
			w.event(false)
		case <-w.timer.C():
			w.onTimer()
			timer = true
		}
	}
}

// load loads and delivers, unless probe is set and the bytes read do not
// hash to it (then it returns the new hash, delivering nothing).
func (w *watchLoop) load(probe string) (readErr, delivered bool, hash string) {
	s, warns, hash, err := loadSource(w.c.opts, w.c.paths)
	if probe != "" && hash != probe {
		return false, false, hash
	}
	w.lastLoad = w.c.clock.Now()
	if err != nil {
		w.c.fail(err)
		return IsReadError(err), true, hash
	}
	w.c.apply(s, warns)
	return false, true, hash
}

// reload plans and watches first, then loads, so a change between the two
// is seen by the watcher (and compared against the plan). setupErr is the
// first directory that could not be watched.
//
// When a config file's directory is missing (its nearest existing ancestor
// watched instead), the plan is recomputed after the watches are set, up
// to watchReplans times, until it watches the same directories: a
// directory created between the plan and its watch (mkdir -p) produces no
// event on the ancestor's watch, which is what the second plan catches.
func (w *watchLoop) reload(probe string) (readErr, delivered bool, hash string, setupErr error) {
	w.plan = newWatchPlan(w.c.opts, w.c.paths)
	setupErr = w.sync()
	for i := 0; w.plan.missing && i < watchReplans; i++ {
		next := newWatchPlan(w.c.opts, w.c.paths)
		if maps.Equal(next.dirs, w.plan.dirs) {
			break
		}
		w.plan = next
		if err := w.sync(); setupErr == nil {
			setupErr = err
		}
	}
	readErr, delivered, hash = w.load(probe)
	return readErr, delivered, hash, setupErr
}

// watchReplans bounds the plans reload recomputes while a config file's
// directory is missing (one more per directory created meanwhile).
const watchReplans = 8

// sync watches the plan's directories and stops watching the others; the
// error is the first directory that could not be watched.
func (w *watchLoop) sync() (setupErr error) {
	for _, d := range sortedKeys(w.watched) {
		if !w.plan.dirs[d] {
			_ = w.w.Remove(d)
			delete(w.watched, d)
		}
	}
	for _, d := range sortedKeys(w.plan.dirs) {
		if w.watched[d] {
			continue
		}
		if err := w.w.Add(d); err != nil {
			if setupErr == nil {
				setupErr = err
			}
			continue
		}
		w.watched[d] = true
	}
	return setupErr
}

// scheduleRetry schedules the next read-error retry (readRetryDelay,
// doubling, at most readRetries), or resets the count after a load
// without read errors.
func (w *watchLoop) scheduleRetry() {
	w.retrying = w.readErr && w.retries < readRetries
	if w.retrying {
		w.timer.Reset(readRetryDelay << w.retries)
		w.retries++
		return
	}
	w.retries = 0
}

// settle is the pause between the two reads of a stability check.
func (w *watchLoop) settle() time.Duration {
	if w.inPlace {
		return watchDebounce
	}
	return watchSettleReplace
}

// event schedules the reload of a burst: watchDebounce after this event,
// but no later than watchMaxWait after the burst's first; a stability
// check past that point runs on. write marks an in-place write.
func (w *watchLoop) event(write bool) {
	now := w.c.clock.Now()
	if !w.pending {
		w.pending, w.burstStart, w.inPlace = true, now, false
	}
	if write {
		w.inPlace = true
	}
	w.retries = 0
	if w.sampling {
		return // sampleFiles runs on its own timer
	}
	deadline := w.deadline()
	switch {
	case now.Add(watchDebounce).Before(deadline):
		w.probe = ""
		w.timer.Reset(watchDebounce)
	case w.probe == "":
		w.timer.Reset(max(deadline.Sub(now), 0))
	}
}

// deadline is the latest a burst's reload starts: watchMaxWait after its
// first event, or after the previous load when the burst began within
// watchMaxWait of it (writes going on across loads).
func (w *watchLoop) deadline() time.Time {
	anchor := w.burstStart
	if !w.lastLoad.IsZero() && w.burstStart.Sub(w.lastLoad) < watchMaxWait {
		anchor = w.lastLoad
	}
	return anchor.Add(watchMaxWait)
}

// onEvent handles one file system event: it forgets a removed watched
// directory (fsnotify drops its watch) and starts or extends a burst when
// the event concerns the config.
func (w *watchLoop) onEvent(ev fsnotify.Event) {
	name := filepath.Clean(ev.Name)
	relevant := w.plan.relevant(ev)
	if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && w.watched[name] {
		delete(w.watched, name)
		_ = w.w.Remove(name)
	}
	if relevant {
		w.event(ev.Has(fsnotify.Write) && !ev.Has(fsnotify.Create))
	}
	if w.c.onEvent != nil {
		w.c.onEvent(ev, relevant)
	}
}

// onTimer runs what the timer was set for: a read-error retry, the first
// read of a stability check, or the reload that ends a burst when the
// files read the same as at the first read (else the check repeats).
func (w *watchLoop) onTimer() {
	w.retrying = false
	if !w.pending {
		w.readErr, _, _, _ = w.reload("")
		w.scheduleRetry()
		return
	}
	if !w.sampling && !w.c.clock.Now().Before(w.deadline()) {
		// Past the burst's deadline: sample until a complete version
		// shows, instead of waiting for the files to stay unchanged.
		w.probe, w.sampling, w.prev = "", true, nil
	}
	if w.sampling {
		w.sampleFiles()
		return
	}
	if w.probe == "" {
		w.probe = readSources(w.c.opts, w.c.paths, &errList{}).hash
		w.timer.Reset(w.settle())
		return
	}
	var delivered bool
	var hash string
	w.readErr, delivered, hash, _ = w.reload(w.probe)
	if !delivered {
		// Changed between the two reads: check again.
		w.probe = hash
		w.timer.Reset(w.settle())
		return
	}
	w.endBurst()
}

// endBurst ends a burst whose reload was delivered.
func (w *watchLoop) endBurst() {
	w.pending, w.probe, w.sampling, w.prev = false, "", false, nil
	w.scheduleRetry()
}

// sampleFiles reads the files once while files keep changing past a
// burst's deadline. A version is complete, and delivered, when it read the
// same for settle, or when a read differs from it other than by growing
// (the next read is not the same files, each starting with its content:
// a writer pausing mid-file is still appending, while the next version
// truncates, replaces or rewrites) and came within watchSampleGap of the
// last read of it. The delivered version is the one read,
// compiled from the bytes read, so a good one among continuous writes is
// applied even when the writes end with a bad one. A read with read
// problems is delivered only once it held still for settle.
func (w *watchLoop) sampleFiles() {
	if w.prev == nil {
		w.plan = newWatchPlan(w.c.opts, w.c.paths)
		_ = w.sync()
	}
	now := w.c.clock.Now()
	errs := &errList{}
	cur := &snapshot{src: readSources(w.c.opts, w.c.paths, errs), errs: errs}
	same := w.prev != nil && cur.src.hash == w.prev.src.hash
	switch {
	case w.prev == nil:
		w.prev, w.prevSince, w.prevLast = cur, now, now
	case same && now.Sub(w.prevSince) < w.settle():
		w.prevLast = now
	case !same && (grows(w.prev.src, cur.src) || len(w.prev.errs.errs) > 0 || w.c.clock.Now().Sub(w.prevLast) >= watchSampleGap):
		// Still being written; a read that failed (a file replaced by
		// remove and create); or reads too far apart to be sure that
		// no state in between (the rest of the file) went unseen: not
		// a version to deliver.
		w.prev, w.prevSince, w.prevLast = cur, now, now
	default:
		w.deliver(w.prev)
		w.endBurst()
		if !same {
			// The files moved on past the version delivered (their
			// events were consumed while sampling): a new burst loads
			// what follows.
			w.pending, w.burstStart = true, now
			w.timer.Reset(watchDebounce)
		}
		return
	}
	w.timer.Reset(watchSampleEvery)
}

// deliver compiles snap and delivers it as load does.
func (w *watchLoop) deliver(snap *snapshot) {
	s, warns, _, err := compileSources(w.c.opts, snap.src, snap.errs, "from "+strings.Join(w.c.paths, ", ")+" (no .yaml or .yml config files)")
	w.lastLoad = w.c.clock.Now()
	w.readErr = false
	if err != nil {
		w.readErr = IsReadError(err)
		w.c.fail(err)
		return
	}
	w.c.apply(s, warns)
}

// grows reports whether next is prev still being written: the same files,
// each starting with its content in prev, and not the same bytes.
func grows(prev, next sources) bool {
	if len(prev.files) != len(next.files) {
		return false
	}
	for i, f := range prev.files {
		n := next.files[i]
		if n.name != f.name || !bytes.HasPrefix(n.data, f.data) {
			return false
		}
	}
	return true
}
