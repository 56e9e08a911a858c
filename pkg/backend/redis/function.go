package redis

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// window1Func is the name of the Redis Function that runs window1Lua,
// versioned by the script's SHA1 so that a changed body gets a new name
// and binaries of two releases share a server during a rolling upgrade,
// each calling its own. Redis hashes the name (case-folded, in 8-byte
// blocks) twice per FCALL, for the command's flags and for the call, so
// it is kept to 16 bytes: "rlw1" and 12 hex digits.
var window1Func = "rlw1" + window1Script.Hash()[:12]

// window1Lib is the name of window1Func's library (what FUNCTION LIST
// shows and FUNCTION LOAD REPLACE replaces): ratelimitd's prefix and the
// function's name, so a changed function name is a changed library too.
var window1Lib = "ratelimitd_" + window1Func

// window1Library is the FUNCTION LOAD source of window1Func: window1Lua
// as the body of the registered function (KEYS and ARGV are its
// arguments), generated from the embedded script so that one source
// decides a lone hit whichever way it is called.
var window1Library = "#!lua name=" + window1Lib + "\n" +
	"redis.register_function('" + window1Func + "', function(KEYS, ARGV)\n" +
	window1Lua + "\nend)\n"

var argFcall, argFuncW1 any = "fcall", window1Func

// fnProbe names no function: FCALL of it answers NOPERM when the user may
// not call functions and "Function not found" when it may (the ACL check
// comes first), without running anything.
const fnProbe = "ratelimitd_fcall_probe"

// FnRetry is how long a master stays on EVALSHA after it refused
// functions before the health probe tries them there again (FUNCTION
// LOAD, then an FCALL of fnProbe): an ACL change or a server upgrade may
// grant them later.
const FnRetry = 30 * time.Second

// Function states of a master (fnState.state).
const (
	fnUnknown int32 = iota // not loaded yet: EVALSHA
	fnLoaded               // window1Func is loaded there: FCALL
	fnRefused              // no FUNCTION/FCALL (Redis < 7, an ACL): EVALSHA, tried again every FnRetry
)

// fnState is what a master is known to have of window1Func. A lone
// window decision goes out as FCALL only once the library was loaded on
// that master; reload asks the next warm-up or health tick, never a
// request, to load it again (the server answered "Function not found":
// FUNCTION FLUSH, a restart without persistence, a failover). A refused
// master is tried again by the health probe FnRetry after the refusal
// or the previous try (due).
type fnState struct {
	state  atomic.Int32
	reload atomic.Bool
	// tried is when functions were last refused or tried again, in
	// UnixNano of the Store's clock.
	tried atomic.Int64
}

// due reports whether f's master refused functions at least FnRetry
// before now, or was last tried again that long ago.
func (f *fnState) due(now time.Time) bool {
	return f.state.Load() == fnRefused && now.UnixNano()-f.tried.Load() >= int64(FnRetry)
}

// fcall reports whether lone window decisions go out as FCALL.
func (f *fnState) fcall() bool { return f != nil && f.state.Load() == fnLoaded }

// isFnRefused reports a reply meaning the server or the user cannot run
// functions: Redis < 7 ("unknown command"), an ACL without the command
// (NOPERM).
func isFnRefused(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command") ||
		strings.Contains(msg, "unknown subcommand")
}

// isFnMissing reports FCALL's reply for a function the server does not
// have.
func isFnMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// refuse makes f's master use EVALSHA from now on, until a try FnRetry
// later finds functions granted; it logs the change, not a refusal of a
// master already refused.
func (f *fnState) refuse(ctx context.Context, name string, err error, now time.Time) {
	f.tried.Store(now.UnixNano())
	if f.state.Swap(fnRefused) == fnRefused {
		return
	}
	if l := logger.Load(); l != nil {
		(*l).Printf(ctx, "redis: %s: functions unavailable (%v); lone window decisions use EVALSHA, functions tried again every %v",
			name, err, FnRetry)
	}
}

// loadFunction loads window1Library on the node of c, the master of
// path m (FUNCTION LOAD REPLACE: the name is this binary's own), at now
// by the Store's clock. A refusal (Redis < 7, an ACL) leaves the
// master on EVALSHA, logged once; any other failure (OOM, a timeout)
// leaves it as it was and asks the health probe to try again. A master
// that refused is tried again only once due, and goes back to FCALL only
// if the user may also call functions (an FCALL of fnProbe), logged
// once. It never fails a warm-up: EVALSHA decides the same.
func loadFunction(ctx context.Context, c *goredis.Client, m *master, now time.Time) {
	f := &m.fn
	again := f.state.Load() == fnRefused
	if again {
		if !f.due(now) {
			return
		}
		f.tried.Store(now.UnixNano())
	}
	err := c.FunctionLoadReplace(ctx, window1Library).Err()
	if err == nil && again {
		if perr := c.Do(ctx, argFcall, fnProbe, 0).Err(); !isFnMissing(perr) {
			err = perr
		}
	}
	switch {
	case err == nil:
		f.reload.Store(false)
		if f.state.Swap(fnLoaded) == fnRefused {
			if l := logger.Load(); l != nil {
				(*l).Printf(ctx, "redis: %s: functions available again; lone window decisions use FCALL", m.name)
			}
		}
	case isFnRefused(err):
		f.refuse(ctx, m.name, err, now)
	case !again:
		f.reload.Store(true)
	}
}

// argsWindowFcall is the FCALL of window1Func deciding the lone
// windowDirect segment sg: window1.lua's keys and arguments.
func argsWindowFcall(ctx context.Context, sg *segArgs) *goredis.Cmd {
	w := sg.win
	var cmd *goredis.Cmd
	if w.cost[0] == 1 {
		cmd = goredis.NewCmd(ctx, argFcall, argFuncW1, int64(1), &w.keys[0], &w.rate[0], &w.ttl)
	} else {
		cmd = goredis.NewCmd(ctx, argFcall, argFuncW1, int64(1), &w.keys[0], &w.rate[0], &w.ttl, &w.cost[0])
	}
	cmd.SetFirstKeyPos(3)
	return cmd
}
