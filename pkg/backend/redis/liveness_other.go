//go:build !linux

package redis

import "syscall"

// pendingBytes is unknown outside Linux: a socket counts as holding
// nothing, so only ratelimitd's own clock tells a stall (see liveness).
func pendingBytes(rc syscall.RawConn) (n int, ok bool) {
	err := rc.Control(func(uintptr) {})
	return 0, err == nil
}

// readBytes is unknown outside Linux (see liveness).
func readBytes(rc syscall.RawConn) (n uint64, ok bool) { return 0, false }

// peerClosed is unknown outside Linux: never closed.
func peerClosed(uintptr) bool { return false }
