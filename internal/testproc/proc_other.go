//go:build !linux

package testproc

import (
	"syscall"
	"time"
)

// procAttr sets nothing outside Linux (no parent-death signal).
func procAttr() *syscall.SysProcAttr { return nil }

// waitStopped gives SIGSTOP a moment outside Linux (no /proc to watch).
func waitStopped(int) { time.Sleep(50 * time.Millisecond) }

// reservePort passes every port outside Linux: only the in-process check
// and StartRetrying hold.
func reservePort(int) bool { return true }
