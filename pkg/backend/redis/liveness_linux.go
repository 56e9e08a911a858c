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

// readBytes is the number of bytes of rc's socket that read calls have
// taken from the kernel since it was opened: the bytes it received
// (TCP_INFO's tcpi_bytes_received, Linux 4.1+) less those still unread;
// ok is false when the socket is closed or the kernel does not say.
func readBytes(rc syscall.RawConn) (n uint64, ok bool) {
	err := rc.Control(func(fd uintptr) {
		info, ierr := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr != nil || info.Bytes_received == 0 {
			return
		}
		unread, ierr := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
		if ierr != nil || unread < 0 || uint64(unread) > info.Bytes_received {
			return
		}
		n, ok = info.Bytes_received-uint64(unread), true
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
