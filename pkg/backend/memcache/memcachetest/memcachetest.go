// Package memcachetest starts real memcached processes for tests: each
// listens on a free loopback TCP port (-l 127.0.0.1 -p PORT -U 0, UDP off)
// and is killed by t.Cleanup.
//
// When memcached is not installed the helpers call t.Skip, unless
// RATELIMITD_REQUIRE_REDIS is set (as `make test` sets it, for every real
// server the tests use), in which case they fail the test.
// scripts/ensure-memcached.sh installs it.
//
// Process controls (Kill, Stop, Cont, Restart) simulate a crashed or
// frozen memcached. The package is test support: it is imported by
// _test.go files only.
package memcachetest

import (
	"bufio"
	"errors"
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
	// Faults: Kill (clients see connection refused), Stop (SIGSTOP: a
	// hung memcached), Cont.
	testproc.Faults
}

// Start starts memcached with extra arguments (e.g. "-m", "64") and
// returns it once it answers "version". It is killed when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, dir: t.TempDir()}
	s.Faults = testproc.NewFaults(&s.proc)
	t.Cleanup(s.cleanup)
	for attempt := 0; ; attempt++ {
		s.port = testproc.FreePort(t)
		s.args = append([]string{"-l", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "0", "-t", "2"}, extra...)
		if os.Geteuid() == 0 {
			s.args = append(s.args, "-u", "root") // memcached refuses to run as root otherwise
		}
		s.start()
		err := s.waitReadyErr()
		if err == nil {
			return s
		}
		if errors.Is(err, testproc.ErrPortInUse) && attempt+1 < testproc.StartAttempts {
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

func (s *Server) start() {
	s.t.Helper()
	if err := s.proc.Start("memcached", s.args, "", filepath.Join(s.dir, "memcached.log")); err != nil {
		s.t.Fatalf("memcachetest: start memcached: %v", err)
	}
}

func (s *Server) waitReadyErr() error {
	return s.proc.WaitReady("memcachetest: memcached on "+s.Addr(), StartTimeout, func() error {
		_, err := s.Do("version")
		return err
	}, func() string { return s.LogTail(20) })
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
