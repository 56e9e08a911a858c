package testproc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procAttr kills the server when the test process dies without running its
// cleanups (a panic, a -timeout abort).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits (at most 2 s) until every thread of pid is stopped
// (state T in /proc/<pid>/task/*/stat): SIGSTOP is delivered
// asynchronously, and a thread still running could answer one more
// request.
func waitStopped(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	for time.Now().Before(deadline) {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		all := len(tasks) > 0
		for _, task := range tasks {
			b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
			if err != nil {
				continue
			}
			// "pid (comm) S ...": the state follows the last ')'.
			st := string(b)
			if i := strings.LastIndexByte(st, ')'); i < 0 || !strings.HasPrefix(st[i+1:], " T") {
				all = false
				break
			}
		}
		if all {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// reservePort takes, for the rest of this process's life, an exclusive
// lock on a file named after port in a directory shared by every test
// process on the host, and reports whether it got it: a port another
// test process holds is passed over, so that two packages' tests running
// in parallel are not given the same port either. The lock goes with the
// process. When the directory cannot be used, every port passes (the
// in-process check and StartRetrying still hold).
func reservePort(port int) bool {
	dir := filepath.Join(os.TempDir(), "ratelimitd-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return !errors.Is(err, syscall.EWOULDBLOCK)
	}
	reserved = append(reserved, f) // kept open: closing it would release the lock
	return true
}

// reserved are the lock files of reservePort (guarded by handedOut).
var reserved []*os.File
