package k8s_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildOut  []byte
	buildDir  string
)

// testVersion is stamped into the test build as the Dockerfile stamps
// VERSION (-X main.version).
const testVersion = "v9.9.9-k8s-test"

// buildRatelimitd builds ./cmd/ratelimitd once per test binary, with the
// Dockerfile's flags (CGO_ENABLED=0, -trimpath, version ldflags). While the
// command does not build yet, tests that need it are skipped, naming why.
func buildRatelimitd(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds ./cmd/ratelimitd; skipped with -short")
	}
	buildOnce.Do(func() {
		dir, err := osMkdirTemp()
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		buildBin = filepath.Join(dir, "ratelimitd")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
			"-ldflags", "-s -w -X main.version="+testVersion+" -X main.commit=abc123",
			"-o", buildBin, "../cmd/ratelimitd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("./cmd/ratelimitd does not build: %v\n%s", buildErr, buildOut)
	}
	return buildBin
}

func runCmd(bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, bin, args...).CombinedOutput()
}

var flagLine = regexp.MustCompile(`(?m)^\s+-{1,2}([a-z][a-z0-9-]*)`)

// serveFlags lists the flags `ratelimitd serve -h` prints.
func serveFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, _ := runCmd(bin, "serve", "-h") // flag.ErrHelp exits non-zero
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllSubmatch(out, -1) {
		flags[string(m[1])] = true
	}
	if !flags["grpc-addr"] || !flags["config"] {
		t.Fatalf("could not read the flags from `ratelimitd serve -h`:\n%s", bytes.TrimSpace(out))
	}
	return flags
}
