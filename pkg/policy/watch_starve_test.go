package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

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
// second of valid writes. The watcher runs on a frozen manual clock that
// the test moves by the interval after each write (once the write's
// events have reached the watcher), so that the times are the writer's,
// not a loaded host's.
func TestWatchLoadsDuringContinuousWrites(t *testing.T) {
	for _, p := range writePatterns {
		for _, every := range []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", p.name, every), func(t *testing.T) {
				t.Parallel()
				path, opts, put := p.setup(t)
				dir := filepath.Dir(path)
				put(versionConfig(0, 5))
				clk := clock.NewManual()
				clk.Freeze()
				w := startWatchConfig(t, watchConfig{opts: opts, paths: []string{path}, clock: clk})
				w.waitSet(t, "v0")

				var written []time.Time // written[n]: when version n was in place
				written = append(written, clk.Now())
				start := clk.Now()
				for n := 1; clk.Now().Sub(start) < 3*time.Second; n++ {
					put(versionConfig(n, 5))
					written = append(written, clk.Now())
					w.sync(t, dir)
					w.advance(t, every)
				}
				lastValid := len(written) - 1
				put("domain: bad\nbogus: 1\n")
				end := clk.Now()
				// Once every event has reached the watcher and it has
				// nothing scheduled, no further load can come: a Set
				// applied after the error would be a load of the invalid
				// version's predecessor read late.
				w.sync(t, dir)
				w.settle(t)

				sets := w.outcomes()[1:] // after the first load, v0
				last := sets[len(sets)-1]
				if last.err == nil || !strings.Contains(last.err.Error(), `unknown key "bogus"`) {
					t.Fatalf("the last outcome is %v, want the invalid last write reported; outcomes %v", last, sets)
				}
				during, prev, maxGap, inForce := 0, start, time.Duration(0), 0
				for i, o := range sets {
					if o.err != nil {
						if !strings.Contains(o.err.Error(), `unknown key "bogus"`) {
							t.Errorf("outcome %d: error %v, want only the invalid last write's", i, o.err)
						}
						continue
					}
					v, rules := setVersion(o.set), len(o.set.Rules())
					if v < 0 || rules != 5 {
						t.Errorf("Set %d applied is not a complete version: %v (%d rules)", i, o.set.Domains(), rules)
					}
					if v < inForce {
						t.Errorf("Set %d applied is version %d after version %d", i, v, inForce)
					}
					inForce = v
					if v > 0 && o.at.Before(end) {
						during++
						maxGap = max(maxGap, o.at.Sub(prev))
						prev = o.at
					}
				}
				if during < 2 {
					t.Errorf("%d Sets applied during 3 s of writes (%d writes), want at least 2; outcomes %v", during, lastValid, sets)
				}
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

// setVersion is n of a Set of one domain v<n>, or -1.
func setVersion(s *Set) int {
	d := s.Domains()
	if len(d) != 1 || !strings.HasPrefix(d[0], "v") {
		return -1
	}
	n, err := strconv.Atoi(d[0][1:])
	if err != nil {
		return -1
	}
	return n
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
