// Package deploytest holds what the deployment tests share (deploy/,
// deploy/helm/, k8s/, and the end-to-end tests of internal/e2e): one
// build of cmd/ratelimitd per test binary, running it until it answers,
// its output collected, free loopback addresses, and the strict
// decoder that reads manifests into the Kubernetes API's own types
// (unknown fields, duplicate keys and unknown kinds are errors), so the
// tests check the objects as a cluster would receive them.
//
// Only tests import it.
package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
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

// FreeAddr is a loopback TCP address ("127.0.0.1:port") that was free a
// moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testproc.FreePort(t)))
}

// FreePorts is n distinct loopback ports, as strings for flags and
// addresses, that were free a moment ago.
func FreePorts(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for _, p := range testproc.FreePorts(t, n) {
		out = append(out, strconv.Itoa(p))
	}
	return out
}

// SyncBuffer collects a process's output. Safe for concurrent use; the
// zero value is empty and ready.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Listening is a "listening" record of ratelimitd's JSON log: Server is
// "grpc", "http", "debug" or "metrics", Addr the bound "host:port".
type Listening struct{ Server, Addr string }

// ScanLog reads r, a ratelimitd's stderr with --log-format=json, to its
// end: every line is appended to log, and every "listening" record is
// sent on listening (which must have room or be read). Lines up to 1 MiB.
func ScanLog(r io.Reader, log *SyncBuffer, listening chan<- Listening) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = log.Write([]byte(line + "\n"))
		var rec struct{ Msg, Server, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
			listening <- Listening{Server: rec.Server, Addr: rec.Addr}
		}
	}
}

// Process is a command started by Start.
type Process struct {
	// Log is the command's stdout and stderr.
	Log  *SyncBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts cmd with its stdout and stderr in Log and stops it when t
// ends: os.Interrupt, then a kill when it has not exited within grace.
func Start(t testing.TB, cmd *exec.Cmd, grace time.Duration) *Process {
	t.Helper()
	p := &Process{Log: &SyncBuffer{}, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// WaitOK polls GET url every 100 ms until it answers 200. It fails t,
// with the last error and the log, when the process exits first or when
// within passes.
func (p *Process) WaitOK(t testing.TB, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		select {
		case <-p.done:
			t.Fatalf("%q exited before GET %s answered 200:\n%s", p.cmd.Args, url, p.Log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s never answered 200 within %v (last: %v):\n%s", url, within, err, p.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// KubeletVolume writes data (file name -> content) into a new temporary
// directory the way the kubelet's atomic writer lays out a ConfigMap or
// Secret volume, and returns the directory: the files are written into a
// ..<timestamp> directory, ..data is a symlink to it, and each name is a
// symlink to ..data/<name>.
func KubeletVolume(t testing.TB, data map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_01_01_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil { //nolint:gosec // a volume's files are world-readable, as the kubelet's default mode
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range data {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
