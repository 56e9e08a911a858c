// Package deploytest holds what the deployment tests share (deploy/,
// deploy/helm/, k8s/, and the end-to-end tests of internal/e2e and
// internal/faults): one build of cmd/ratelimitd per test binary (Build,
// BuildMain), running it until it answers (StartServe, Start), its output
// collected, free loopback addresses, and the strict
// decoder that reads manifests into the Kubernetes API's own types
// (unknown fields, duplicate keys and unknown kinds are errors), so the
// tests check the objects as a cluster would receive them.
//
// Only tests import it.
package deploytest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var builds struct {
	mu   sync.Mutex
	dirs []string
	by   map[string]*build // by the build flags, joined
}

type build struct {
	once sync.Once
	bin  string
	out  []byte
	err  error
}

// Ratelimitd builds the module's ./cmd/ratelimitd with CGO_ENABLED=0 and
// buildFlags (before -o, e.g. "-trimpath", "-ldflags", "...") once per
// test binary and set of flags, and returns the binary's path. It skips t
// under -short, and fails t with the compiler's output when the command
// does not build. RemoveBuilds deletes the binaries (see Main).
func Ratelimitd(t testing.TB, buildFlags ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs ./cmd/ratelimitd; skipped with -short")
	}
	key := strings.Join(buildFlags, "\x00")
	builds.mu.Lock()
	if builds.by == nil {
		builds.by = map[string]*build{}
	}
	b := builds.by[key]
	if b == nil {
		b = &build{}
		builds.by[key] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() { b.bin, b.out, b.err = Build(buildFlags...) })
	if b.err != nil {
		t.Fatalf("./cmd/ratelimitd does not build: %v\n%s", b.err, b.out)
	}
	return b.bin
}

// Build builds the module's ./cmd/ratelimitd with buildFlags into a new
// temporary directory (removed by RemoveBuilds), for a TestMain that has
// no t: the binary's path, or the error and the compiler's output. It
// builds with CGO_ENABLED=0 unless buildFlags has -race (which needs cgo).
func Build(buildFlags ...string) (bin string, output []byte, err error) {
	return buildRatelimitd(buildFlags)
}

func buildRatelimitd(flags []string) (string, []byte, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "ratelimitd-deploytest-")
	if err != nil {
		return "", nil, err
	}
	builds.mu.Lock()
	builds.dirs = append(builds.dirs, dir)
	builds.mu.Unlock()
	bin := filepath.Join(dir, "ratelimitd")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(append([]string{"build"}, flags...), "-o", bin, "./cmd/ratelimitd")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if !slices.Contains(flags, "-race") {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	out, err := cmd.CombinedOutput()
	return bin, out, err
}

// moduleRoot is the nearest directory above the working directory (a
// test's package directory) that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("deploytest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// RemoveBuilds deletes every binary Ratelimitd built.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	for _, d := range builds.dirs {
		_ = os.RemoveAll(d)
	}
	builds.dirs = nil
}

// Main is a TestMain: it runs the tests, removes the builds and exits with
// the tests' code.
func Main(m *testing.M) {
	code := m.Run()
	RemoveBuilds()
	os.Exit(code)
}
