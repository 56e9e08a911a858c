package testproc

import (
	"os"
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
