package memcachetest

import "syscall"

// procAttr kills memcached when the test process dies without running its
// cleanups (a panic, a -timeout abort).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
