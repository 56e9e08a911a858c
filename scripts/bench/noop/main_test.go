package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// TestShouldRateLimitOK: many concurrent callers, each with requests of
// varying domains and descriptors, all get OK.
func TestShouldRateLimitOK(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newGRPCServer()
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	c := rlsv3.NewRateLimitServiceClient(testproc.Dial(t, l.Addr().String()))

	const callers, calls = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, callers*calls)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				req := &rlsv3.RateLimitRequest{
					Domain:      fmt.Sprintf("d%d", g),
					Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("user", fmt.Sprint(i))},
					HitsAddend:  uint32(i),
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				switch {
				case err != nil:
					errs <- err
				case resp.GetOverallCode() != rlsv3.RateLimitResponse_OK:
					errs <- fmt.Errorf("caller %d call %d: %v, want OK", g, i, resp.GetOverallCode())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestBinaryServes builds the command as scripts/bench-compare.sh does,
// runs it on free ports, waits for /healthcheck, gets OK from
// ShouldRateLimit and checks it exits 0 on SIGTERM.
func TestBinaryServes(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "noop")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var grpcAddr string
	var cmd *exec.Cmd
	var out *testproc.Buffer
	var done chan error
	// Fresh ports on each start: one may be taken before the binary binds it.
	err := testproc.StartRetrying("noop", func() error {
		ports := testproc.FreePorts(t, 2)
		var httpAddr string
		grpcAddr, httpAddr = fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
		cmd = exec.Command(bin, "--grpc-addr", grpcAddr, "--http-addr", httpAddr)
		out = &testproc.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		testproc.KillWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done = make(chan error, 1)
		go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(cmd, done)
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			done <- <-done // leave the result for a later reader
		})
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get("http://" + httpAddr + "/healthcheck")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			select {
			case werr := <-done:
				done <- werr
				if testproc.PortInUse(out.String()) {
					return fmt.Errorf("noop exited: %w\n%s", testproc.ErrPortInUse, out.String())
				}
				return fmt.Errorf("noop exited before /healthcheck answered: %v\n%s", werr, out.String())
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("/healthcheck: %v\n%s", err, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	c := rlsv3.NewRateLimitServiceClient(testproc.Dial(t, grpcAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench",
		Descriptors: []*rlcommon.RateLimitDescriptor{testproc.Desc("hot", "hot-0")}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v; want OK", resp.GetOverallCode(), err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30s after SIGTERM\n%s", out.String())
	}
}

// TestBinaryBusyPortFails: a gRPC address already in use is an error
// exit, not a server that never answers.
func TestBinaryBusyPortFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = run(l.Addr().String(), fmt.Sprintf("127.0.0.1:%d", testproc.FreePort(t)))
	if err == nil {
		t.Fatal("run on a busy gRPC address returned nil")
	}
}
