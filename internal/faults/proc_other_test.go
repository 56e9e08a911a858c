//go:build !linux

package faults

import "os/exec"

// setProcAttr: see proc_linux_test.go (no parent-death signal here).
func setProcAttr(*exec.Cmd) {}
