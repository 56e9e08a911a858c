package testproc

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
)

// ErrPortInUse is the error of a start whose process exited because a
// port it was given was taken between choosing it and binding it (its
// output says "address already in use"): the caller picks other ports
// and starts again (StartRetrying). WaitReady returns it.
var ErrPortInUse = errors.New("port in use")

// PortInUse reports whether a process's output says that a bind failed
// because the address was taken ("bind: address already in use" from Go,
// "Address already in use" from redis-server, memcached and postgres).
func PortInUse(output string) bool {
	return strings.Contains(strings.ToLower(output), "address already in use")
}

// StartAttempts bounds the starts of StartRetrying.
const StartAttempts = 5

// StartRetrying calls start until it returns nil or an error other than
// ErrPortInUse, at most StartAttempts times; start must pick fresh ports
// (FreePorts) on each call. A port can still be taken between the pick
// and the bind by a process that binds port 0 or picks its own (another
// package's tests run in parallel), so a start that lost its port is
// repeated rather than failed. After StartAttempts lost ports the error
// names what and wraps the last one.
func StartRetrying(what string, start func() error) error {
	var err error
	for range StartAttempts {
		if err = start(); !errors.Is(err, ErrPortInUse) {
			return err
		}
	}
	return fmt.Errorf("%s: a port was taken on each of %d starts: %w", what, StartAttempts, err)
}

// handedOut is every port FreePorts returned in this process: none is
// returned twice, so that two servers of one test process (or of two
// tests in parallel) are never given the same port, even after the first
// chooser released it and before the second bound it.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// maxSkips bounds the ports FreePorts passes over (handed out already, or
// reserved by another test process) for one call.
const maxSkips = 1000

// FreePort is a loopback TCP port that was free a moment ago and that no
// other FreePort or FreePorts call of this process returns (the caller
// binds it, or picks another on ErrPortInUse). It fails t when no port
// can be had.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts is n distinct loopback TCP ports that were free a moment ago,
// none returned before in this process and, where the platform allows,
// none reserved by another test process on this host (see reservePort).
// It fails t when they cannot be had.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ps, err := freePorts(n)
	if err != nil {
		t.Fatalf("testproc: free port: %v", err)
	}
	return ps
}

// freePorts binds port 0 until the kernel has given n ports that pass,
// holding every listener (passed-over ones included, so that the kernel
// offers another port) until the choice is made.
func freePorts(n int) ([]int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for skipped := 0; len(out) < n; {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		p := l.Addr().(*net.TCPAddr).Port
		if handedOut.ports[p] || !reservePort(p) {
			if skipped++; skipped > maxSkips {
				return nil, fmt.Errorf("passed over %d ports already handed out or reserved", maxSkips)
			}
			continue
		}
		handedOut.ports[p] = true
		out = append(out, p)
	}
	return out, nil
}
