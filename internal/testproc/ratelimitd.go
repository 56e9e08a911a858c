package testproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ratelimitdPkg is the import path of the server binary.
const ratelimitdPkg = "github.com/ratelimitd/ratelimitd/cmd/ratelimitd"

// RunWithRatelimitd is the body of a TestMain whose tests run the
// ratelimitd binary: it builds cmd/ratelimitd into a new temporary
// directory (with -race when race; with -ldflags ldflags when ldflags is
// not empty), sets *bin to its path, runs m, removes the directory and,
// when every test passed, fails the run for goroutines still alive
// (goleak). It returns the exit code for os.Exit; a failed build is code
// 1, with the go command's output on stderr, prefixed by name.
func RunWithRatelimitd(m *testing.M, name string, bin *string, race bool, ldflags string) int {
	dir, err := os.MkdirTemp("", "ratelimitd-"+name+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	*bin = filepath.Join(dir, "ratelimitd")
	args := []string{"build", "-o", *bin}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	if race {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ratelimitdPkg)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, name+": go build:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// CleanEnv is an environment for a child process with nothing from the
// test's own (no RATELIMITD_* or envoyproxy/ratelimit variables): PATH,
// HOME set to the temporary directory, then extra ("NAME=value" each).
func CleanEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, extra...)
}

// Listener names of `ratelimitd serve`, as its "listening" log records
// name them (the server attribute).
const (
	GRPC  = "grpc"
	HTTP  = "http"
	Debug = "debug"
)

// Serve is one running `ratelimitd serve`, started by StartServe. Its
// stderr is kept (Logs); its stdout is discarded.
type Serve struct {
	// Cmd is the process; Cmd.ProcessState is set once Done is closed.
	Cmd *exec.Cmd
	// Addrs maps the name of each listener StartServe waited for (GRPC,
	// HTTP, Debug) to the host:port it logged.
	Addrs map[string]string

	logs Buffer
	done chan struct{}
	err  error // Wait's result, after done

	stopOnce sync.Once
	stopErr  error
}

// StartServe runs bin with args (from "serve" on; they must include
// --log-format=json) and env (the whole environment, see CleanEnv), and
// returns once the process has logged a "listening" record for each of
// listeners. It returns an error, with the logs, when the process exits
// first or when within passes (the process is then killed). The caller
// stops the process (Stop).
func StartServe(bin string, args, env, listeners []string, within time.Duration) (*Serve, error) {
	s := &Serve{Cmd: exec.Command(bin, args...), Addrs: map[string]string{}, done: make(chan struct{})}
	s.Cmd.Env = env
	s.Cmd.Stdout = io.Discard
	KillWithParent(s.Cmd)
	stderr, err := s.Cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.Cmd.Start(); err != nil {
		return nil, err
	}
	addrs := make(chan [2]string, 8)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = s.logs.Write([]byte(line + "\n"))
			var rec struct{ Msg, Server, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				addrs <- [2]string{rec.Server, rec.Addr}
			}
		}
		s.err = s.Cmd.Wait()
		close(s.done)
	}()
	deadline := time.After(within)
	for !s.listening(listeners) {
		select {
		case a := <-addrs:
			s.Addrs[a[0]] = a[1]
		case <-s.done:
			return nil, fmt.Errorf("ratelimitd exited during startup: %v\n%s", s.err, s.Logs())
		case <-deadline:
			_ = s.Cmd.Process.Kill()
			<-s.done
			return nil, fmt.Errorf("ratelimitd did not log its listeners within %v\n%s", within, s.Logs())
		}
	}
	return s, nil
}

// listening reports whether every one of names has an address.
func (s *Serve) listening(names []string) bool {
	for _, n := range names {
		if s.Addrs[n] == "" {
			return false
		}
	}
	return true
}

// Logs is everything the process wrote to stderr so far.
func (s *Serve) Logs() string { return s.logs.String() }

// LogTail is the last n lines of Logs.
func (s *Serve) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(s.Logs(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Done is closed once the process has exited.
func (s *Serve) Done() <-chan struct{} { return s.done }

// Err is the process's exit error (nil for exit code 0); read it after
// Done is closed.
func (s *Serve) Err() error { return s.err }

// Signal sends sig to the process.
func (s *Serve) Signal(sig os.Signal) error { return s.Cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to grace for the exit. An exit code
// other than 0 (66 after a data race under -race), a "DATA RACE" in the
// logs, or no exit within grace (the process is then killed) is an error,
// with the logs. A process that had already exited is judged the same
// way. Safe to call more than once: later calls return the first result.
func (s *Serve) Stop(grace time.Duration) error {
	s.stopOnce.Do(func() {
		_ = s.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
			if code := s.Cmd.ProcessState.ExitCode(); code != 0 || strings.Contains(s.Logs(), "DATA RACE") {
				s.stopErr = fmt.Errorf("ratelimitd exited %d after SIGTERM\n%s", code, s.Logs())
			}
		case <-time.After(grace):
			_ = s.Cmd.Process.Kill()
			<-s.done
			s.stopErr = fmt.Errorf("ratelimitd ignored SIGTERM for %v\n%s", grace, s.LogTail(50))
		}
	})
	return s.stopErr
}

// Dial opens a plaintext gRPC client connection to addr (host:port),
// closed when t ends.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Health is cc's grpc.health.v1 status of service ("" for the server as
// a whole), asked with a 2 s deadline; an error when the check itself
// failed.
func Health(cc *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// WaitHealth polls Health of service every 10 ms until it is want, and
// returns an error with the last status and error when within passes
// first.
func WaitHealth(cc *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		st, err := Health(cc, service)
		if err == nil && st == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("health %q not %v within %v (last: %v, %v)", service, want, within, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreePorts returns n distinct loopback TCP ports (decimal strings) that
// were free a moment ago: all n are held open together, then released.
func FreePorts(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		out = append(out, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return out
}
