package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr kills redis-server when the test process dies without running
// its cleanups (e.g. on a panic or a -timeout abort).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
