// Package testproc runs the server processes of the tests.
//
// Proc runs the servers of the test helpers (redis-server, memcached):
// start, kill, freeze and resume, with the output in a log file and the
// server killed when the test process dies without its cleanups
// (KillWithParent). FreePorts picks their ports (never one twice in a
// process), and StartRetrying starts one again on fresh ports when its
// port was taken first. The rest is what any package's tests of ratelimitd
// share: talking to a running server, building descriptors, reading its
// metrics and statsd lines, and choosing quick or long variants. Running
// the binary itself is internal/deploytest's.
package testproc

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is one server process, started again after a Kill by Start. The
// zero value has no process. Safe for concurrent use.
type Proc struct {
	// Prepare, when set, adjusts each command before it starts (after
	// KillWithParent): a helper that must run its server as another
	// user sets the credential here.
	Prepare func(*exec.Cmd)

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been waited for
	stopped bool          // SIGSTOPped
}

// Start runs name with args in dir (the current directory when empty),
// its stdout and stderr appended to logPath. It replaces a previous
// process, which must have been killed.
func (p *Proc) Start(name string, args []string, dir, logPath string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	KillWithParent(cmd)
	if p.Prepare != nil {
		p.Prepare(cmd)
	}
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(done)
	}()
	p.cmd, p.done, p.stopped = cmd, done, false
	return nil
}

// Pid is the current process' id (0 before Start).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Done is closed once the current process has exited (nil before Start).
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Alive reports whether the process is running (possibly frozen).
func (p *Proc) Alive() bool {
	done := p.Done()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to exit: clients then see
// connection refused. Kill without a live process is a no-op.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done, stopped := p.cmd, p.done, p.stopped
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	if stopped {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	<-done
}

// Stop freezes the process with SIGSTOP and returns once every thread is
// stopped: connections stay open and the kernel still accepts new ones,
// but nothing is answered (a hung server).
func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.stopped {
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		waitStopped(p.cmd.Process.Pid)
		p.stopped = true
	}
}

// Cont resumes a process frozen by Stop (SIGCONT).
func (p *Proc) Cont() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.stopped {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		p.stopped = false
	}
}

// KillWithParent sets cmd up, before its Start, to be killed when the
// test process dies without running its cleanups (Linux: a parent-death
// SIGKILL; elsewhere nothing).
func KillWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = procAttr() }

// Faults are a Proc's fault controls (Kill, Stop, Cont, see Proc), for a
// test helper's Server to embed, so that each helper does not restate
// them. The zero value has no process; use NewFaults.
type Faults struct{ p *Proc }

// NewFaults returns the fault controls of p.
func NewFaults(p *Proc) Faults { return Faults{p: p} }

// Kill is Proc.Kill: clients then see connection refused.
func (f Faults) Kill() { f.p.Kill() }

// Stop is Proc.Stop: a hung server.
func (f Faults) Stop() { f.p.Stop() }

// Cont is Proc.Cont.
func (f Faults) Cont() { f.p.Cont() }

// WaitReady polls ready every 20 ms until it returns nil, for at most
// within. It returns ErrPortInUse (wrapped, naming what) or another error
// naming what ("redis-server on 127.0.0.1:6379") when the process exits
// first, and an error with ready's last error when within passed; both
// end with logTail(), the process's last log lines.
func (p *Proc) WaitReady(what string, within time.Duration, ready func() error, logTail func() string) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.Done():
			tail := logTail()
			if PortInUse(tail) {
				return fmt.Errorf("%s: %w", what, ErrPortInUse)
			}
			return fmt.Errorf("%s exited during startup:\n%s", what, tail)
		default:
		}
		if last = ready(); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v: %v\n%s", what, within, last, logTail())
}
