//go:build unix

package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// runAs returns how to run initdb and postgres: as they are, or, as
// root, as the postgres user (created with useradd when missing), with
// dir and everything below it given to that user.
func runAs(dir string) (func(*exec.Cmd), error) {
	if os.Geteuid() != 0 {
		return ownGroup, nil
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
		ownGroup(cmd)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}, nil
}

// ownGroup starts cmd in a process group of its own: postgres and its
// backends are signalled together (signalGroup).
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) { _ = syscall.Kill(-pid, sig) }

// groupGone reports whether no process of the group led by pid is left.
func groupGone(pid int) bool { return syscall.Kill(-pid, 0) == syscall.ESRCH }

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
	uid, err = strconv.Atoi(string(trim(u)))
	if err != nil {
		return 0, 0, err
	}
	gid, err = strconv.Atoi(string(trim(g)))
	return uid, gid, err
}

func trim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
