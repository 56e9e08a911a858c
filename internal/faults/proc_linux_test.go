package faults

import (
	"os/exec"
	"syscall"
)

// setProcAttr kills a child (ratelimitd, a CPU spinner) when the test
// process dies without running its cleanups (a panic, a -timeout abort).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
