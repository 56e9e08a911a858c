//go:build unix

package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runAs returns how to run initdb and postgres: as they are, or, as
// root, as the postgres user (created with useradd when missing), with
// dir and everything below it given to that user.
func runAs(dir string) (func(*exec.Cmd), error) {
	if os.Geteuid() != 0 {
		return func(*exec.Cmd) {}, nil
	}
	uid, gid, err := postgresUser()
	if err != nil {
		return nil, err
	}
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}); err != nil {
		return nil, err
	}
	// t.TempDir's parents are 0700 root: the user needs to pass through.
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return func(cmd *exec.Cmd) {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}, nil
}

// tree is pid and its children (/proc; postgres' backends, each in a
// session of its own, so that no process group holds them all).
func tree(pid int) []int {
	out := []int{pid}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(p); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// statFields are the fields of /proc/<pid>/stat after "(comm)": state,
// ppid, pgrp, ...; nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	st := string(b)
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(st[i+1:])
}

// signalAll sends sig to every pid.
func signalAll(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}

// waitGone waits (at most 10 s) until no pid is left.
func waitGone(pids []int) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		left := false
		for _, p := range pids {
			if f := statFields(p); f != nil && f[0] != "Z" {
				left = true
			}
		}
		if !left {
			return
		}
	}
}

// waitStopped waits (at most 2 s) until every pid is stopped (state T):
// SIGSTOP is delivered asynchronously, and a backend still running could
// answer one more query.
func waitStopped(pids []int) {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		all := true
		for _, p := range pids {
			if f := statFields(p); f != nil && f[0] != "T" && f[0] != "t" && f[0] != "Z" {
				all = false
			}
		}
		if all {
			return
		}
	}
}

// postgresUser looks the postgres user up, creating it when missing.
func postgresUser() (uid, gid int, err error) {
	if _, err := exec.Command("id", "-u", "postgres").Output(); err != nil {
		if out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home", "postgres").CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("useradd postgres: %v: %s", err, out)
		}
	}
	u, err := exec.Command("id", "-u", "postgres").Output()
	if err != nil {
		return 0, 0, err
	}
	g, err := exec.Command("id", "-g", "postgres").Output()
	if err != nil {
		return 0, 0, err
	}
	if uid, err = strconv.Atoi(strings.TrimSpace(string(u))); err != nil {
		return 0, 0, err
	}
	gid, err = strconv.Atoi(strings.TrimSpace(string(g)))
	return uid, gid, err
}
