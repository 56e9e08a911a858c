//go:build !linux

package memcachetest

import "syscall"

// procAttr sets nothing outside Linux (no parent-death signal).
func procAttr() *syscall.SysProcAttr { return nil }
