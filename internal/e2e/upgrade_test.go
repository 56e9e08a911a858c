package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// windowKeyVersionLine is the line of pkg/backend/redis that introduced
// the versioned window keys: the binary built from the commit before it
// is the release a rolling upgrade starts from.
const windowKeyVersionLine = `const windowKeyVersion = ":v2:"`

// buildPrevious builds ratelimitd from the parent of the commit that
// introduced windowKeyVersionLine (git archive of that tree, go build),
// or reuses the build of an earlier run, and returns the binary's path.
func buildPrevious(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %v: %v (the cross-version test needs the repository's history)", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	intro := git("log", "--format=%H", "-S", windowKeyVersionLine, "--reverse", "--", "pkg/backend/redis/window.go")
	intro, _, _ = strings.Cut(intro, "\n")
	if intro == "" {
		t.Fatalf("no commit introduces %s in pkg/backend/redis/window.go", windowKeyVersionLine)
	}
	prev := git("rev-parse", intro+"^")
	// The binary of a commit never changes: it is kept in a per-user cache
	// directory keyed by the commit and reused by later runs.
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = t.TempDir()
	}
	keep := filepath.Join(cache, "ratelimitd-upgrade", prev+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	old := filepath.Join(keep, "ratelimitd")
	if _, err := os.Stat(old); err == nil {
		return old
	}
	dir := t.TempDir()
	tarball := filepath.Join(t.TempDir(), "previous.tar")
	git("archive", "--format=tar", "-o", tarball, prev)
	if out, err := exec.Command("tar", "-x", "-f", tarball, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
		t.Fatal(err)
	}
	staging, err := os.MkdirTemp(filepath.Dir(keep), "staging-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(staging)
	build := exec.Command("go", "build", "-o", filepath.Join(staging, "ratelimitd"), "./cmd/ratelimitd")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Run(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", prev, err, out.String())
	}
	if err := os.Rename(staging, keep); err != nil {
		if _, serr := os.Stat(old); serr != nil { // not another run's copy
			t.Fatalf("previous binary: %v", err)
		}
	}
	return old
}

// startBin is start with another binary.
func startBin(t *testing.T, binary string, args ...string) *proc {
	t.Helper()
	all := append([]string{"serve", "--log-format=json", "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=127.0.0.1:0"}, args...)
	s, err := deploytest.StartServe(binary, all, deploytest.CleanEnv(), []string{deploytest.GRPC, deploytest.HTTP, deploytest.Debug}, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Serve: s, grpc: s.Addrs[deploytest.GRPC], http: s.Addrs[deploytest.HTTP], debug: s.Addrs[deploytest.Debug]}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// hammer sends n ShouldRateLimit calls for descriptor k=value to each of
// ccs from 8 goroutines per connection and returns how many each
// connection admitted.
func hammer(t *testing.T, ccs []*grpc.ClientConn, value string, n int) []int64 {
	t.Helper()
	admitted := make([]atomic.Int64, len(ccs))
	var wg sync.WaitGroup
	var failed atomic.Value
	for i, cc := range ccs {
		per := n / 8
		for g := range 8 {
			wg.Go(func() {
				for range per + btoi(g < n%8) {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", value)}})
					cancel()
					if err != nil {
						failed.Store(err)
						return
					}
					if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
						admitted[i].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(ccs))
	for i := range admitted {
		out[i] = admitted[i].Load()
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRollingUpgradeWindowKeys runs the release before versioned window
// keys and this one side by side on one Redis, as in a rolling upgrade.
// With the defaults each version counts in its own keys, so each admits
// exactly the limit and together twice it (the bound docs/redis.md
// states); with --redis-window-keys=false they share the old layout and
// together admit exactly the limit. A run that straddles the hourly
// window boundary is bounded per window spanned.
func TestRollingUpgradeWindowKeys(t *testing.T) {
	redistest.Require(t)
	old := buildPrevious(t)
	srv := redistest.Standalone(t)
	rc := srv.Client()
	t.Cleanup(func() { _ = rc.Close() })
	dir := t.TempDir()
	const limit = 20
	writeFile(t, dir, "e2e.yaml", strings.Replace(fmt.Sprintf(oneFile, limit), "unit: minute", "unit: hour", 1))
	common := []string{"--config", dir, "--backend=redis", "--redis-url", srv.URL(), "--redis-timeout=2s"}

	hour := func() int64 {
		tm, err := rc.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.Unix() / 3600
	}

	prev := startBin(t, old, common...)
	next := startBin(t, bin, common...)
	nextCompat := startBin(t, bin, append(common, "--redis-window-keys=false")...)
	cp, cn, cc := prev.dial(t), next.dial(t), nextCompat.dial(t)
	for _, x := range []struct {
		p  *proc
		cc *grpc.ClientConn
	}{{prev, cp}, {next, cn}, {nextCompat, cc}} {
		x.p.waitServing(t, x.cc, "")
	}

	// Defaults: each version in its own keys.
	h0 := hour()
	got := hammer(t, []*grpc.ClientConn{cp, cn}, "upgrade", 3*limit)
	windows := hour() - h0 + 1
	if got[0] > limit*windows || got[1] > limit*windows {
		t.Fatalf("side by side: previous admitted %d, new %d of %d each, want at most %d each (%d windows)", got[0], got[1], 3*limit, limit*windows, windows)
	}
	if windows == 1 && (got[0] != limit || got[1] != limit) {
		t.Fatalf("side by side in one window: previous admitted %d, new %d, want exactly %d each", got[0], got[1], limit)
	}
	keys, err := rc.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var plain, versioned int
	for _, k := range keys {
		switch {
		case strings.Contains(k, ":v2:"):
			versioned++
		case !strings.Contains(k, "{"):
			plain++
		}
	}
	if versioned == 0 || plain == 0 {
		t.Errorf("keys %q: want the previous layout's key and a versioned window key", keys)
	}

	// --redis-window-keys=false: one layout, the limit once.
	h0 = hour()
	got = hammer(t, []*grpc.ClientConn{cp, cc}, "compat", 3*limit)
	windows = hour() - h0 + 1
	if total := got[0] + got[1]; total > limit*windows || windows == 1 && total != limit {
		t.Fatalf("previous layout shared: admitted %d + %d of %d, want exactly %d (%d windows)", got[0], got[1], 6*limit, limit, windows)
	}
}
