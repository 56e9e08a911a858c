// Package testproc runs the server processes of the tests.
//
// Proc runs the servers of the test helpers (redis-server in
// pkg/backend/redis/redistest, memcached in
// pkg/backend/memcache/memcachetest): start with the output appended to a
// log file, kill, freeze (SIGSTOP) and resume, and tell whether the
// process is alive. RunWithRatelimitd and StartServe build and run
// ratelimitd itself for the end-to-end tests (internal/e2e,
// internal/faults); Dial, Health and WaitHealth talk to it, and Desc and
// WithHits build the descriptors of the requests tests send. A server is
// killed when the test process dies without running its cleanups (Linux:
// a parent-death signal).
package testproc

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// Proc is one server process, started again after a Kill by Start. The
// zero value has no process. Safe for concurrent use.
type Proc struct {
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
