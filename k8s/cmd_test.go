package k8s_test

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// testVersion is stamped into the test build as the Dockerfile stamps
// VERSION (-X main.version).
const testVersion = "v9.9.9-k8s-test"

// buildRatelimitd builds ./cmd/ratelimitd once per test binary, with the
// Dockerfile's flags (CGO_ENABLED=0, -trimpath, version ldflags); skipped
// with -short.
func buildRatelimitd(t *testing.T) string {
	t.Helper()
	return deploytest.Ratelimitd(t, "-trimpath", "-ldflags", "-s -w -X main.version="+testVersion+" -X main.commit=abc123")
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
