//go:build !unix

package pgtest

import (
	"os/exec"
	"syscall"
)

// runAs runs initdb and postgres as they are outside unix.
func runAs(string) (func(*exec.Cmd), error) { return func(*exec.Cmd) {}, nil }

func signalGroup(int, syscall.Signal) {}

func groupGone(int) bool { return true }
