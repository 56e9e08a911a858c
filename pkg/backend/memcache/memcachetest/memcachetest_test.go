package memcachetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const childEnv = "MEMCACHETEST_REQUIRE_CHILD"

// TestRequireChild is run by TestRequire in a child process whose PATH has
// no memcached.
func TestRequireChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return // not the child
	}
	Require(t)
	t.Log("memcached found")
}

// Without memcached on PATH, Require skips; with RATELIMITD_REQUIRE_REDIS
// set (make test) it fails the test instead.
func TestRequire(t *testing.T) {
	run := func(require bool) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRequireChild$", "-test.v", "-test.count=1")
		env := []string{childEnv + "=1", "PATH=" + t.TempDir(), "HOME=" + os.TempDir()}
		if require {
			env = append(env, RequireEnv+"=1")
		}
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(false)
	if err != nil || !strings.Contains(out, "--- SKIP: TestRequireChild") || !strings.Contains(out, "memcached not on PATH") {
		t.Errorf("without %s: err %v, want a skip naming memcached:\n%s", RequireEnv, err, out)
	}
	out, err = run(true)
	if err == nil || !strings.Contains(out, "--- FAIL: TestRequireChild") || !strings.Contains(out, RequireEnv+" is set") {
		t.Errorf("with %s: err %v, want a failure:\n%s", RequireEnv, err, out)
	}
}

// Start gives a memcached that counts, and Restart an empty one on the
// same port.
func TestStartRestart(t *testing.T) {
	s := Start(t)
	if got, err := s.Do("add k 0 0 1\r\n5"); err != nil || got != "STORED" {
		t.Fatalf("add: %q %v", got, err)
	}
	if got, err := s.Do("incr k 2"); err != nil || got != "7" {
		t.Fatalf("incr: %q %v, want 7", got, err)
	}
	port := s.Port()
	s.Restart()
	if s.Port() != port {
		t.Fatalf("port %d after restart, want %d", s.Port(), port)
	}
	if got, err := s.Do("incr k 1"); err != nil || got != "NOT_FOUND" {
		t.Fatalf("incr after restart: %q %v, want NOT_FOUND (empty)", got, err)
	}
}
