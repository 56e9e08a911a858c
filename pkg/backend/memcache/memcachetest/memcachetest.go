// Package memcachetest starts real memcached processes for tests: each
// listens on a free loopback TCP port (-l 127.0.0.1 -p PORT -U 0, UDP off)
// and is killed by t.Cleanup.
//
// When memcached is not installed the helpers call t.Skip, unless the
// environment variable RATELIMITD_REQUIRE_REDIS is set (as `make test`
// does; it requires every real server the tests use, redis-server and
// memcached alike), in which case they fail the test: CI never skips
// memcached tests silently. scripts/ensure-memcached.sh installs it.
//
// Process controls (Kill, Stop, Cont, Restart) simulate a crashed or
// frozen memcached. The package is test support: it is imported by
// _test.go files only.
package memcachetest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// RequireEnv is the environment variable that turns a missing memcached
// into a test failure instead of a skip (shared with redistest).
const RequireEnv = "RATELIMITD_REQUIRE_REDIS"

// StartTimeout bounds how long Start waits for memcached to answer.
const StartTimeout = 20 * time.Second

// Require skips (or, with RATELIMITD_REQUIRE_REDIS set, fails) t when
// memcached is not on PATH.
func Require(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("memcached"); err == nil {
		return
	}
	msg := "memcachetest: memcached not on PATH (run scripts/ensure-memcached.sh)"
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s and %s is set", msg, RequireEnv)
	}
	t.Skip(msg)
}

// Server is one memcached process.
type Server struct {
	t    testing.TB
	dir  string
	port int
	args []string

	proc testproc.Proc
}

// Start starts memcached with extra arguments (e.g. "-m", "64") and
// returns it once it answers "version". It is killed when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, dir: t.TempDir()}
	t.Cleanup(s.cleanup)
	for attempt := 0; ; attempt++ {
		s.port = freePort(t)
		s.args = append([]string{"-l", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "0", "-t", "2"}, extra...)
		if os.Geteuid() == 0 {
			s.args = append(s.args, "-u", "root") // memcached refuses to run as root otherwise
		}
		s.start()
		err := s.waitReadyErr()
		if err == nil {
			return s
		}
		if errors.Is(err, errPortInUse) && attempt < 5 {
			s.Kill()
			continue
		}
		t.Fatalf("%v", err)
	}
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the listening port.
func (s *Server) Port() int { return s.port }

var errPortInUse = errors.New("memcachetest: port in use")

func (s *Server) start() {
	s.t.Helper()
	if err := s.proc.Start("memcached", s.args, "", filepath.Join(s.dir, "memcached.log")); err != nil {
		s.t.Fatalf("memcachetest: start memcached: %v", err)
	}
}

func (s *Server) waitReadyErr() error {
	deadline := time.Now().Add(StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.proc.Done():
			tail := s.LogTail(20)
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("%w: %s", errPortInUse, s.Addr())
			}
			return fmt.Errorf("memcachetest: memcached on %s exited during startup:\n%s", s.Addr(), tail)
		default:
		}
		if _, last = s.Do("version"); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("memcachetest: memcached on %s not ready after %v: %v\n%s", s.Addr(), StartTimeout, last, s.LogTail(20))
}

// Do sends one text-protocol command line (without "\r\n") on a fresh
// connection and returns the first reply line (without "\r\n").
func (s *Server) Do(line string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(line + "\r\n")); err != nil {
		return "", err
	}
	r, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(r, "\r\n"), nil
}

// LogTail returns up to n last lines of memcached's output.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "memcached.log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Kill sends SIGKILL and waits for the process to exit: clients then see
// connection refused. Kill on a dead server is a no-op.
func (s *Server) Kill() { s.proc.Kill() }

// Stop freezes the process with SIGSTOP and returns once it is stopped:
// the kernel still accepts connections, nothing is answered (a hung
// memcached).
func (s *Server) Stop() { s.proc.Stop() }

// Cont resumes a process frozen by Stop.
func (s *Server) Cont() { s.proc.Cont() }

// Restart kills the process (if alive) and starts it again on the same
// port, empty, waiting until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
	if err := s.waitReadyErr(); err != nil {
		s.t.Fatalf("%v", err)
	}
}

func (s *Server) cleanup() {
	if s.t.Failed() {
		s.t.Logf("memcachetest: output of memcached on %s:\n%s", s.Addr(), s.LogTail(20))
	}
	s.Kill()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("memcachetest: free port: %v", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
