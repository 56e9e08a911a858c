package memcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	gomemcache "github.com/bradfitz/gomemcache/memcache"
)

func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err    error
		cause  string
		outage bool
	}{
		{refused, CauseRefused, true},
		{io.EOF, CauseRefused, true},
		{gomemcache.ErrNoServers, CauseRefused, true},
		{&gomemcache.ConnectTimeoutError{Addr: &net.TCPAddr{}}, CauseTimeout, true},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), CauseTimeout, true},
		{context.DeadlineExceeded, CauseTimeout, true},
		{context.Canceled, CauseCanceled, false},
		{errors.New(`memcache: unexpected response line from "add": "SERVER_ERROR out of memory storing object\r\n"`), CauseOOM, false},
		{errors.New("memcache: client error: bad data chunk"), CauseOther, false},
	} {
		err := Classify(c.err)
		var e *Error
		if !errors.As(err, &e) || e.Cause() != c.cause || e.Outage() != c.outage {
			t.Errorf("Classify(%v) = %v, want cause %q outage %v", c.err, err, c.cause, c.outage)
			continue
		}
		if !errors.Is(err, c.err) {
			t.Errorf("Classify(%v) does not unwrap to it", c.err)
		}
		if Classify(err) != err {
			t.Errorf("Classify of a classified error wrapped it again")
		}
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) != nil")
	}
}
