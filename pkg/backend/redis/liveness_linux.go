package redis

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// pendingBytes is the number of bytes received on rc's socket and not read
// yet (FIONREAD); ok is false when the socket is closed.
func pendingBytes(rc syscall.RawConn) (n int, ok bool) {
	err := rc.Control(func(fd uintptr) {
		var ierr error
		n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // TIOCINQ is FIONREAD on Linux
		ok = ierr == nil
	})
	return n, ok && err == nil
}

// peerClosed reports whether the peer closed the socket fd: a
// non-blocking MSG_PEEK reads end of stream.
func peerClosed(fd uintptr) bool {
	var b [1]byte
	n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return n == 0 && err == nil
}
