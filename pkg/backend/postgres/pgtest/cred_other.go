//go:build !unix

package pgtest

import (
	"os/exec"
	"syscall"
	"time"
)

// runAs runs initdb and postgres as they are outside unix.
func runAs(string) (func(*exec.Cmd), error) { return func(*exec.Cmd) {}, nil }

func tree(pid int) []int { return []int{pid} }

func signalAll([]int, syscall.Signal) {}

func waitGone([]int) {}

func waitStopped([]int) { time.Sleep(50 * time.Millisecond) }
