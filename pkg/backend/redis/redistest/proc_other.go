//go:build !linux

package redistest

import "os/exec"

// setProcAttr is a no-op outside Linux (no parent-death signal).
func setProcAttr(cmd *exec.Cmd) {}
