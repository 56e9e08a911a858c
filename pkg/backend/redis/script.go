package redis

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// takeParts holds take.lua, the script that decides a batch of requests
// (segments), one file per role, in the order they run:
//
//	10_args.lua            the protocol (KEYS, ARGV, reply, errors, values)
//	                       and the parsing and validation of every segment
//	20_reads.lua           the server's TIME and the MGET read-ahead cache
//	30_math.lua            exact integer division, calendar windows (pkg/algo/calendar.go)
//	40_state.lua           string-kind values: parse, SET with PX, DEL
//	50_fixed_window.lua    fixed_window (pkg/algo/take.go fixedWindow)
//	51_sliding_window.lua  sliding_window (pkg/algo/take.go slidingWindow)
//	52_token_bucket.lua    token_bucket (pkg/algo/take.go tokenBucket)
//	55_string_kinds.lua    rate 0, releases and the table interface of the string kinds
//	60_log.lua             sliding_log and concurrency (sorted sets)
//	70_segment.lua         the general decision path (repeated keys, sorted
//	                       sets, refunds) and the reply line
//	80_fast_segment.lua    the direct path: a take of string kinds on distinct keys
//	90_main.lua            one pcall per segment, the reply
//
// Each part is a sequence of whole top-level Lua statements; they share
// one chunk's locals, so the order is part of the script.
//
//go:embed take/*.lua
var takeParts embed.FS

// takeLua is take.lua: the parts of takeParts in name order, joined by a
// blank line, at package init (Redis runs one script body per EVALSHA).
// The body, and so its SHA1, depends only on the embedded files. It is
// called with EVALSHA; a call answered NOSCRIPT (first call on a server,
// SCRIPT FLUSH, restart, failover) is sent again as EVAL, which caches it
// again (batcher.exec).
var takeLua = joinParts(takeParts, "take")

// joinParts is the *.lua files of dir in fsys in name order, joined by
// "\n". It panics if dir holds none: the embedded files are part of the
// build.
func joinParts(fsys fs.FS, dir string) string {
	names, err := fs.Glob(fsys, dir+"/*.lua")
	if err != nil || len(names) == 0 {
		panic(fmt.Sprintf("redis: no embedded %s/*.lua: %v", dir, err))
	}
	parts := make([]string, len(names))
	for i, n := range names { // fs.Glob sorts
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			panic(fmt.Sprintf("redis: embedded %s: %v", n, err))
		}
		parts[i] = string(b)
	}
	return strings.Join(parts, "\n")
}

// takeScript is the shared script handle; its SHA1 (EVALSHA's argument) is
// computed once.
var takeScript = goredis.NewScript(takeLua)

// take1Lua is the fast path of takeLua for a batch of segments that are
// each a take of one plain hit of a string kind (segArgs.simple): the same
// decisions, values, TTLs and reply lines for those, at a fraction of the
// server's work per call (no per-invocation parsing of the general
// protocol, no closures for the other kinds, refunds or sorted sets).
//
//go:embed take1.lua
var take1Lua string

// take1Script is take1Lua's handle.
var take1Script = goredis.NewScript(take1Lua)

// ScriptSHA is the SHA1 of the embedded script, the argument of its
// EVALSHA (SCRIPT EXISTS tells whether a server has it).
func ScriptSHA() string { return takeScript.Hash() }

// FastScriptSHA is the SHA1 of the embedded fast-path script (take1.lua),
// which Warm loads next to take.lua.
func FastScriptSHA() string { return take1Script.Hash() }

// Script modes (a segment's first header field).
const (
	modeTake   = "t"
	modeRefund = "r"
	// modeDenied decides a take whose request another slot group already
	// denied: as a take that denied (nothing but the kept hits is
	// written; the other hits report a check on the state before it).
	modeDenied = "d"
)

// fieldsPerHit is the number of ARGV entries per hit after a segment's
// header: NF in take/10_args.lua (testdata/script_args.golden shows the
// layout).
const fieldsPerHit = 8

// segmentHeader is the number of ARGV entries before a segment's hits
// (mode, now_us, nonce, number of hits): NS in take/10_args.lua.
const segmentHeader = 4

// replyPerHit is the number of integers per hit in a segment's reply line
// after now_us.
const replyPerHit = 5

// Pre-boxed ARGV values: converting a string to an interface allocates,
// a pre-boxed one does not.
var (
	argModeTake   any = modeTake
	argModeRefund any = modeRefund
	argModeDenied any = modeDenied
	argServerNow  any = ""
	argEvalSHA    any = "evalsha"
	argEval       any = "eval"
	argSHA        any = takeScript.Hash()
	argScript     any = takeLua
	argSHA1       any = take1Script.Hash()
	argScript1    any = take1Lua
)

// fieldsSimple is the number of take1.lua ARGV entries per segment (now,
// kind, rate, period_us, burst, cost; take1.lua checks #ARGV against it).
const fieldsSimple = 6

// segment is one request's hits (Cluster: one hash slot's hits of a
// request) as one part of a script invocation: decided atomically and
// all-or-nothing on its own, in order with the other segments of the
// invocation.
type segment struct {
	mode  string
	nowUS int64 // < 0: the server's TIME
	nonce string
	hits  []algo.Hit
	// native: the hits are all native (nativeHit), decided by INCRBY
	// and PEXPIRE at nowUS, the service's clock, without a script;
	// slack is added to their TTLs (pinnedSlackMs with a pinned clock).
	native bool
	slack  int64
	// window: the hits are all windowKind and decided by window.lua on
	// the keys of the windows containing estUS (the estimate of the
	// server's now) or nowUS when pinned.
	window bool
	estUS  int64
	// check: the window script reads the server's TIME and refuses the
	// segment, writing nothing, when its keys do not name the server's
	// current window (see Store.windowNow).
	check bool
	// lean: the hits are all leanKind and decided by lean.lua (keys as
	// for window).
	lean bool
}

// segArgs is a segment's script arguments, copied from its hits when the
// call is queued (so that a flush never reads a caller's hits, which the
// caller may reuse once it has returned) and stored so that the command's
// []any holds pointers into it (*string, *int64: go-redis writes them
// without boxing allocations). It must not be copied after init.
type segArgs struct {
	mode  any // argModeTake, argModeRefund or argModeDenied
	now   any // argServerNow or &ints[0]
	nonce string
	keys  []string // KEYS of the segment's hits, in order
	// ints are now_us, the number of hits, then per hit kind, rate,
	// period_us, burst, calendar, multiplier, cost, flags (1 release,
	// 2 soft, 4 charge).
	ints []int64

	// simple: a take of one hit of a string kind without a calendar, a
	// release or a charge, with rate >= 1 (take1.lua decides it).
	simple bool

	keyBuf [1]string
	intBuf [2 + fieldsPerHit]int64

	// win is set for a window segment (segment.window): &winBuf.
	win    *winArgs
	winBuf winArgs
	// lean is set for a lean segment (segment.lean).
	lean *leanArgs
}

// isSimple reports whether take1.lua decides sg: a take of exactly one hit
// of fixed_window, sliding_window or token_bucket, without a calendar, a
// release or a charge, with 1 <= rate < 2^53, 1 <= period < 2^53 µs and
// |burst| < 2^53 (a Soft hit alone is decided like any other: its denial
// writes nothing either way). Everything else goes to take.lua.
func isSimple(sg *segment) bool {
	if sg.mode != modeTake || len(sg.hits) != 1 {
		return false
	}
	h := &sg.hits[0]
	l := &h.Limit
	switch l.Kind {
	case algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket:
	default:
		return false
	}
	const big = algo.MaxExact
	p := l.Period.Microseconds()
	return !h.Release && !h.Charge && !h.Penalty.On() && l.Calendar == algo.CalendarNone &&
		l.Rate >= 1 && l.Rate < big && p >= 1 && p < big && l.Burst > -big && l.Burst < big &&
		sg.nowUS < big
}

// init copies sg's arguments into a.
func (a *segArgs) init(sg *segment) {
	n := len(sg.hits)
	switch sg.mode {
	case modeRefund:
		a.mode = argModeRefund
	case modeDenied:
		a.mode = argModeDenied
	default:
		a.mode = argModeTake
	}
	a.nonce = sg.nonce
	if sg.lean {
		a.now = argServerNow
		if sg.nowUS >= 0 {
			a.ints = append(a.intBuf[:0], sg.nowUS)
			a.now = &a.ints[0]
		}
		a.initLean(sg)
		return
	}
	if sg.window {
		a.initWindow(sg)
		return
	}
	a.keys, a.ints = a.keyBuf[:0], a.intBuf[:0]
	boxes := 0 // hits with a penalty box: one more key, 3 more fields
	for i := range sg.hits {
		if sg.hits[i].Penalty.On() {
			boxes++
		}
	}
	if n+boxes > len(a.keyBuf) {
		a.keys = make([]string, 0, n+boxes)
		a.ints = make([]int64, 0, 2+fieldsPerHit*n+3*boxes)
	}
	a.simple = isSimple(sg)
	a.ints = append(a.ints, sg.nowUS, int64(n))
	a.now = argServerNow
	if sg.nowUS >= 0 {
		a.now = &a.ints[0]
	}
	for i := range sg.hits {
		h := &sg.hits[i]
		l := &h.Limit
		flags := int64(0) // take.lua: 1 release, 2 soft, 4 charge, 8 penalty, 16 extend
		if h.Release {
			flags |= 1
		}
		if h.Soft {
			flags |= 2
		}
		if h.Charge {
			flags |= 4
		}
		if p := h.Penalty; p.On() {
			flags |= 8
			if p.Extend {
				flags |= 16
			}
		}
		a.keys = append(a.keys, h.Key)
		// The cost is clamped like algo.Take clamps it (the script rejects
		// a segment with a cost above 2^53): the same decision as in memory.
		a.ints = append(a.ints,
			int64(l.Kind), l.Rate, l.Period.Microseconds(), l.Burst,
			int64(l.Calendar), max(l.Multiplier, 1), algo.ClampCost(h.Cost), flags)
		if p := h.Penalty; p.On() {
			a.keys = append(a.keys, penaltyKey(h.Key))
			a.ints = append(a.ints, p.After, max(p.Within.Microseconds(), 1), max(p.Block.Microseconds(), 1))
		}
	}
}

// hits is the number of hits of the segment.
func (a *segArgs) hits() int { return len(a.keys) }

// appendKeys appends the segment's KEYS to args.
func (a *segArgs) appendKeys(args []any) []any {
	for i := range a.keys {
		args = append(args, &a.keys[i])
	}
	return args
}

// appendArgs appends the segment's ARGV entries to args: mode, now_us
// ("" for the server's TIME), nonce, number of hits, then per hit kind,
// rate, period_us, burst, calendar, multiplier, cost, flags.
func (a *segArgs) appendArgs(args []any) []any {
	args = append(args, a.mode, a.now, &a.nonce)
	for i := 1; i < len(a.ints); i++ {
		args = append(args, &a.ints[i])
	}
	return args
}

// appendSimple appends the segment's take1.lua ARGV entries to args: now
// ("" for the server's TIME), kind, rate, period_us, burst, cost.
func (a *segArgs) appendSimple(args []any) []any {
	return append(args, a.now, &a.ints[2], &a.ints[3], &a.ints[4], &a.ints[5], &a.ints[8])
}

// argsCmd is one script invocation deciding the segments of segs in order,
// as EVALSHA (sha) or EVAL: command, SHA1 or script, numkeys, keys,
// segment count, segments. The first key is at position 3 (Cluster
// routing).
func argsCmd(ctx context.Context, sha bool, segs []*segArgs) *goredis.Cmd {
	if segs[0].win != nil {
		return argsWindow(ctx, sha, segs)
	}
	if segs[0].lean != nil {
		return argsLean(ctx, sha, segs)
	}
	simple := true
	for _, sg := range segs {
		if !sg.simple {
			simple = false
			break
		}
	}
	if simple {
		return argsSimple(ctx, sha, segs)
	}
	nkeys, nargs := 0, 1
	for _, sg := range segs {
		nkeys += sg.hits()
		nargs += segmentHeader + fieldsPerHit*sg.hits()
	}
	a := make([]any, 0, 3+nkeys+nargs)
	if sha {
		a = append(a, argEvalSHA, argSHA)
	} else {
		a = append(a, argEval, argScript)
	}
	a = append(a, int64(nkeys))
	for _, sg := range segs {
		a = sg.appendKeys(a)
	}
	a = append(a, int64(len(segs)))
	for _, sg := range segs {
		a = sg.appendArgs(a)
	}
	cmd := goredis.NewCmd(ctx, a...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// argsSimple is argsCmd for segments that are all simple: one take1.lua
// invocation (EVALSHA or EVAL), one key and fieldsSimple ARGV per segment.
func argsSimple(ctx context.Context, sha bool, segs []*segArgs) *goredis.Cmd {
	a := make([]any, 0, 3+len(segs)*(1+fieldsSimple))
	if sha {
		a = append(a, argEvalSHA, argSHA1)
	} else {
		a = append(a, argEval, argScript1)
	}
	a = append(a, int64(len(segs)))
	for _, sg := range segs {
		a = sg.appendKeys(a)
	}
	for _, sg := range segs {
		a = sg.appendSimple(a)
	}
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// SegmentError is the error of one segment that the script reported in its
// reply ("!<error>") while the invocation's other segments were decided:
// a Redis error reply such as "OOM ...", "READONLY ..." or "WRONGTYPE ...",
// a Lua error, or the script's rejection of the segment's arguments
// ("ERR ratelimitd take.lua: invalid segment: <field> of hit <i>", e.g.
// an invalid Limit). It is a go-redis error reply (goredis.Error), so
// Classify gives it the cause of its prefix (CauseOther for ERR and Lua
// errors, not an outage); the segment wrote nothing.
type SegmentError string

// Error returns the reply text as the script sent it, without the "!"
// marker.
func (e SegmentError) Error() string { return string(e) }

// RedisError marks SegmentError as an error reply of a live server.
func (SegmentError) RedisError() {}

var _ goredis.Error = SegmentError("")

// errReply is a reply the Store cannot parse (a take.lua/Go mismatch).
var errReply = errors.New("redis: unexpected script reply")

// parseSegment decodes the reply line of one segment at the start of r
// into out (len(out) == the segment's hits) and returns the segment's now
// in µs and the rest of r after the line's "\n". A "!" line is returned as
// a SegmentError (rest still advances past it). It allocates nothing
// unless it fails.
func parseSegment(r string, out []algo.Decision) (nowUS int64, rest string, err error) {
	line, rest, _ := strings.Cut(r, "\n")
	if len(line) > 0 && line[0] == '!' {
		return 0, rest, SegmentError(line[1:])
	}
	p := line
	next := func() (int64, bool) {
		var f string
		f, p, _ = strings.Cut(p, " ")
		n, err := strconv.ParseInt(f, 10, 64)
		return n, err == nil
	}
	nowUS, ok := next()
	if !ok {
		return 0, rest, fmt.Errorf("%w: segment line %q", errReply, truncate(line))
	}
	var v [replyPerHit]int64
	for i := range out {
		for j := range v {
			if v[j], ok = next(); !ok {
				return 0, rest, fmt.Errorf("%w: segment line %q for %d hits", errReply, truncate(line), len(out))
			}
		}
		out[i] = algo.Decision{
			Allowed:     v[0] == 1,
			Penalty:     penaltyOutcome(v[0]),
			Remaining:   v[1],
			RetryAfter:  algo.MicrosDuration(v[2]),
			ResetAfter:  algo.MicrosDuration(v[3]),
			WindowAfter: algo.MicrosDuration(v[4]),
		}
	}
	if len(p) != 0 {
		return 0, rest, fmt.Errorf("%w: segment line %q longer than %d hits", errReply, truncate(line), len(out))
	}
	return nowUS, rest, nil
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// penaltyOutcome is the penalty box's part of a reply's allowed field (2
// started, 3 blocked; take/10_args.lua).
func penaltyOutcome(a int64) algo.PenaltyOutcome {
	switch a {
	case 2:
		return algo.PenaltyStarted
	case 3:
		return algo.PenaltyBlocked
	}
	return algo.PenaltyNone
}
