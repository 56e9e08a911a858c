package deploytest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// BuildMain is the body of a TestMain whose tests run one build of
// ratelimitd: it builds it with buildFlags (Build), sets *bin to its
// path, runs m, removes the build (RemoveBuilds) and, when every test
// passed, fails the run for goroutines still alive (goleak). It returns
// the exit code for os.Exit; a failed build is code 1, with the
// compiler's output on stderr, prefixed by name.
func BuildMain(m *testing.M, name string, bin *string, buildFlags ...string) int {
	defer RemoveBuilds()
	var out []byte
	var err error
	if *bin, out, err = Build(buildFlags...); err != nil {
		fmt.Fprintf(os.Stderr, "%s: go build: %v\n%s", name, err, out)
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
// name them (Listening.Server).
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

	logs SyncBuffer
	done chan struct{}
	err  error // Wait's result, after done

	stopOnce sync.Once
	stopErr  error
}

// StartServe runs bin with args (from "serve" on; they must include
// --log-format=json) and env (the whole environment, see CleanEnv), and
// returns once the process has logged a "listening" record for each of
// listeners (ScanLog). It returns an error, with the logs, when the
// process exits first (wrapping testproc.ErrPortInUse when it could not
// bind a listener's port: see testproc.StartRetrying) or when within passes (the process is then
// killed). The process is killed with the test process when that dies
// without its cleanups (testproc.KillWithParent); the caller stops it
// (Stop).
func StartServe(bin string, args, env, listeners []string, within time.Duration) (*Serve, error) {
	s := &Serve{Cmd: exec.Command(bin, args...), Addrs: map[string]string{}, done: make(chan struct{})}
	s.Cmd.Env = env
	s.Cmd.Stdout = io.Discard
	testproc.KillWithParent(s.Cmd)
	stderr, err := s.Cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.Cmd.Start(); err != nil {
		return nil, err
	}
	addrs := make(chan Listening, 8)
	go func() {
		ScanLog(stderr, &s.logs, addrs)
		s.err = s.Cmd.Wait()
		close(s.done)
	}()
	deadline := time.After(within)
	for !s.listening(listeners) {
		select {
		case a := <-addrs:
			s.Addrs[a.Server] = a.Addr
		case <-s.done:
			if testproc.PortInUse(s.Logs()) {
				return nil, fmt.Errorf("ratelimitd exited during startup: %w: %v\n%s", testproc.ErrPortInUse, s.err, s.LogTail(20))
			}
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
