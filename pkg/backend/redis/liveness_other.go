//go:build !linux

package redis

import "syscall"

// pendingBytes is unknown outside Linux: a socket counts as holding
// nothing, so only ratelimitd's own clock tells a stall (see liveness).
func pendingBytes(rc syscall.RawConn) (n int, ok bool) {
	err := rc.Control(func(uintptr) {})
	return 0, err == nil
}

// peerClosed is unknown outside Linux: never closed.
func peerClosed(uintptr) bool { return false }
