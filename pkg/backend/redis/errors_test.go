package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// replyErr is an error reply from a live server (go-redis' Error shape).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	cases := []struct {
		err    error
		cause  string
		outage bool
	}{
		{context.DeadlineExceeded, redis.CauseTimeout, true},
		{fmt.Errorf("evalsha: %w", context.DeadlineExceeded), redis.CauseTimeout, true},
		{os.ErrDeadlineExceeded, redis.CauseTimeout, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, redis.CauseTimeout, true},
		{goredis.ErrPoolTimeout, redis.CauseTimeout, true},
		{context.Canceled, redis.CauseCanceled, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, redis.CauseRefused, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, redis.CauseReset, true},
		{io.EOF, redis.CauseReset, true},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, redis.CauseReset, true},
		{goredis.ErrClosed, redis.CauseRefused, true},
		{&net.DNSError{Err: "no such host", Name: "redis"}, redis.CauseRefused, true},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), redis.CauseOOM, false},
		{replyErr("READONLY You can't write against a read only replica."), redis.CauseReadonly, false},
		{replyErr("LOADING Redis is loading the dataset in memory"), redis.CauseLoading, true},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), redis.CauseLoading, true},
		{replyErr("CLUSTERDOWN The cluster is down"), redis.CauseClusterDown, true},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), redis.CauseClusterDown, true},
		{replyErr("NOSCRIPT No matching script. Please use EVAL."), redis.CauseNoScript, false},
		{replyErr("WRONGPASS invalid username-password pair or user is disabled."), redis.CauseAuth, false},
		{replyErr("NOPERM this user has no permissions to run the 'evalsha' command"), redis.CauseAuth, false},
		{replyErr("ERR DB index is out of range"), redis.CauseAuth, false},
		{replyErr("ERR Error running script (call to f_x): @user_script:1: oops"), redis.CauseOther, false},
		{errors.New("something odd"), redis.CauseOther, true},
		{redis.ErrCircuitOpen, redis.CauseCircuitOpen, false},
		{fmt.Errorf("take: %w", redis.ErrCircuitOpen), redis.CauseCircuitOpen, false},
	}
	for _, tc := range cases {
		err := redis.Classify(tc.err)
		var e *redis.Error
		if !errors.As(err, &e) {
			t.Fatalf("Classify(%v) = %T", tc.err, err)
		}
		if e.Cause() != tc.cause || e.Outage() != tc.outage {
			t.Errorf("Classify(%v): cause %q outage %v, want %q %v", tc.err, e.Cause(), e.Outage(), tc.cause, tc.outage)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("Classify(%v) does not unwrap to it", tc.err)
		}
		var c service.Causer
		if !errors.As(fmt.Errorf("wrapped: %w", err), &c) || c.Cause() != tc.cause {
			t.Errorf("Classify(%v) is not a service.Causer with cause %q", tc.err, tc.cause)
		}
		if got := redis.CauseOf(tc.err); got != tc.cause {
			t.Errorf("CauseOf(%v) = %q, want %q", tc.err, got, tc.cause)
		}
		if again := redis.Classify(err); again != err {
			t.Errorf("Classify is not idempotent for %v", tc.err)
		}
		found := false
		for _, c := range redis.Causes {
			found = found || c == tc.cause
		}
		if !found {
			t.Errorf("cause %q missing from Causes", tc.cause)
		}
	}
	if redis.Classify(nil) != nil || redis.CauseOf(nil) != "" {
		t.Error("nil is not classified as nil")
	}
}
