package causes_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestTransport(t *testing.T) {
	for _, c := range []struct {
		err    error
		cause  string
		outage bool
		ok     bool
	}{
		{context.Canceled, causes.Canceled, false, true},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), causes.Timeout, true, true},
		{os.ErrDeadlineExceeded, causes.Timeout, true, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, causes.Timeout, true, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, causes.Refused, true, true},
		{os.NewSyscallError("write", syscall.EPIPE), causes.Refused, true, true},
		{io.ErrUnexpectedEOF, causes.Refused, true, true},
		{net.ErrClosed, causes.Refused, true, true},
		{&net.DNSError{Err: "no such host", Name: "cache"}, "", false, false},
		{errors.New("a reply"), "", false, false},
	} {
		cause, outage, ok := causes.Transport(c.err)
		if cause != c.cause || outage != c.outage || ok != c.ok {
			t.Errorf("Transport(%v) = %q, %v, %v; want %q, %v, %v", c.err, cause, outage, ok, c.cause, c.outage, c.ok)
		}
	}
	if !causes.Dial(&net.DNSError{Err: "no such host", Name: "cache"}) || !causes.Dial(&net.OpError{Op: "dial", Err: errors.New("x")}) {
		t.Error("Dial misses a *net.DNSError or *net.OpError")
	}
	if causes.Dial(errors.New("a reply")) {
		t.Error("Dial of a plain error")
	}
}
