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
		{&net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ENOENT)}, causes.Refused, true, true},
		{os.NewSyscallError("connect", syscall.ENOENT), causes.Refused, true, true},
		{&os.PathError{Op: "open", Path: "/run/secrets/pw", Err: syscall.ENOENT}, "", false, false},
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

// backendErr is a backend's Error type for TestWrap, as redis.Error and
// memcache.Error embed Classified.
type backendErr struct{ causes.Classified }

func TestClassified(t *testing.T) {
	inner := io.ErrUnexpectedEOF
	c := causes.New("redis", causes.Refused, true, inner)
	if c.Cause() != causes.Refused || !c.Outage() {
		t.Errorf("Cause %q Outage %v, want refused true", c.Cause(), c.Outage())
	}
	if got, want := c.Error(), "redis: refused: unexpected EOF"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(c, inner) {
		t.Error("errors.Is does not reach the classified error")
	}
}

func TestWrap(t *testing.T) {
	calls := 0
	classify := func(err error) (string, bool) { calls++; return causes.Timeout, true }
	wrap := func(cause string, outage bool, err error) *backendErr {
		return &backendErr{causes.New("memcache", cause, outage, err)}
	}
	if err := causes.Wrap[*backendErr](nil, classify, wrap); err != nil || calls != 0 {
		t.Errorf("Wrap(nil) = %v after %d classify calls, want nil and none", err, calls)
	}
	err := causes.Wrap(os.ErrDeadlineExceeded, classify, wrap)
	var be *backendErr
	if !errors.As(err, &be) || be.Cause() != causes.Timeout || !be.Outage() || !errors.Is(err, os.ErrDeadlineExceeded) || calls != 1 {
		t.Fatalf("Wrap = %#v (%d classify calls), want a *backendErr timeout outage wrapping the error, classified once", err, calls)
	}
	// An error whose chain already holds the backend's Error is returned
	// as it is, not classified again.
	outer := fmt.Errorf("take: %w", err)
	if got := causes.Wrap(outer, classify, wrap); got != outer || calls != 1 {
		t.Errorf("Wrap of a classified error = %v (%d classify calls), want it unchanged and no new classify", got, calls)
	}
}
