package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// leaseLua does one lease operation (algo.LeaseRequest) in one call:
// return, demand, charge. See its header for the keys, arguments and
// reply.
//
//go:embed lease.lua
var leaseLua string

// leaseScript is leaseLua's handle.
var leaseScript = goredis.NewScript(leaseLua)

// LeaseScriptSHA is the SHA1 of the embedded lease script.
func LeaseScriptSHA() string { return leaseScript.Hash() }

// errLeaseReply is the error of a lease reply of the wrong shape.
var errLeaseReply = errors.New("redis: lease script reply is not an integer array of 3 + 2n")

// leaseKeys returns the keys of a lease of l on base when the server's
// clock reads at (µs): the window's count (and the one before it for a
// sliding window) or the bucket, then the demands; and the window start.
// With window keys (Options.WindowKeys) a fixed window that Take counts
// under a window key is counted under the same key (windowKey), so that a
// lease and the hits decided exactly count on one counter.
func (s *Store) leaseKeys(base string, l algo.Limit, at int64) ([]string, int64) {
	tag := tagged(base)
	switch l.Kind {
	case algo.FixedWindow:
		p := l.Period.Microseconds()
		ws := at - at%p
		if s.windowKeys && windowKind(&algo.Hit{Key: base, Limit: l}) {
			return []string{windowKey(base, ws), tag + ":d"}, ws
		}
		return []string{tag + ":" + strconv.FormatInt(ws, 10), tag + ":d"}, ws
	case algo.SlidingWindow:
		p := l.Period.Microseconds()
		ws := at - at%p
		return []string{tag + ":" + strconv.FormatInt(ws, 10), tag + ":" + strconv.FormatInt(ws-p, 10), tag + ":d"}, ws
	default:
		return []string{tag + ":tb", tag + ":d"}, 0
	}
}

// tagged is base with a hash tag: itself when it has one, else "{base}"
// (then base must hold no '}', which policy keys never do; such a base is
// used as it is, one slot per key).
func tagged(base string) string {
	if i := strings.IndexByte(base, '{'); i >= 0 {
		if j := strings.IndexByte(base[i+1:], '}'); j > 0 {
			return base
		}
	}
	if strings.IndexByte(base, '}') >= 0 {
		return base
	}
	return "{" + base + "}"
}

// Lease does req in one script call (lease.lua), with the window of the
// keys taken from the estimate of the server's clock. When the server's
// window differs (a clock step, the first call, a window boundary passed
// while the call was under way) the script writes nothing, and the call
// is sent again with the server's window, for as long as ctx allows: a
// window moves again only when a boundary passed between a reply and the
// next call, so a slow client or server costs round trips, never a grant
// in a window the server is not in. The call is bounded by ctx only: a
// lease operation runs in the background of the requests (pkg/lease
// bounds it, and no request waits for it past its own deadline), so
// Options.Timeout, the budget of a request's call, does not apply. At
// most half of Options.PoolSize calls are in flight at once; the others
// wait for a turn within ctx. Errors are classified (*Error).
func (s *Store) Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error) {
	if !algo.Leasable(req.Limit) {
		return algo.LeaseGrant{}, newError(CauseOther, false, fmt.Errorf("redis: limit kind %d cannot be leased", req.Limit.Kind))
	}
	// Each call takes a pooled connection of its own: many concurrent
	// calls (an RLQS round's) wait here, within ctx, and leave the rest of
	// the pool to the other calls, rather than queue in the pool, whose
	// wait is bounded by the request Timeout and fails as an outage.
	if s.leaseSlots != nil {
		select {
		case s.leaseSlots <- struct{}{}:
			defer func() { <-s.leaseSlots }()
		case <-ctx.Done():
			return algo.LeaseGrant{}, Classify(fmt.Errorf("redis: lease not sent: %w", ctx.Err()))
		}
	}
	pinned := s.nowUS()
	at := pinned
	if at < 0 {
		at = s.clock().UnixMicro() + s.leaseOffset.Load()
	}
	for {
		g, serverNow, err := s.leaseAt(ctx, req, at, pinned)
		if err != nil {
			s.noteOutcome(err, false)
			return algo.LeaseGrant{}, err
		}
		if g.Granted >= 0 {
			s.noteOutcome(nil, true)
			return g, nil
		}
		if err := ctx.Err(); err != nil {
			return algo.LeaseGrant{}, Classify(fmt.Errorf("redis: lease window kept moving: %w", err))
		}
		at = serverNow
	}
}

// leaseAt runs the script once with the keys of the window containing at;
// Granted -1 means the server's window is another one, whose now it
// returns.
func (s *Store) leaseAt(ctx context.Context, req algo.LeaseRequest, at, pinned int64) (algo.LeaseGrant, int64, error) {
	l := req.Limit
	keys, ws := s.leaseKeys(req.Key, l, at)
	now, born := "", ""
	if pinned >= 0 {
		now, born = strconv.FormatInt(pinned, 10), strconv.FormatInt(s.born, 10)
	}
	kind := map[algo.Kind]int{algo.FixedWindow: 0, algo.SlidingWindow: 1, algo.TokenBucket: 3}[l.Kind]
	capa := l.Rate
	if l.Kind == algo.TokenBucket && l.Burst > 0 {
		capa = l.Burst
	}
	args := []any{now, born, kind, l.Rate, l.Period.Microseconds(), capa, ws,
		max(req.Want, 0), max(req.Return, 0), req.ReturnWindow, req.Subscriber, max(req.Demand, 0), max(req.Stale, 0)}
	v, err := leaseScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return algo.LeaseGrant{}, 0, Classify(err)
	}
	if len(v) < 3 || len(v)%2 == 0 {
		return algo.LeaseGrant{}, 0, newError(CauseOther, false, errLeaseReply)
	}
	if pinned < 0 {
		s.leaseOffset.Store(v[2] - s.clock().UnixMicro())
	}
	g := algo.LeaseGrant{Granted: v[0], Remaining: v[1], Now: v[2]}
	for i := 3; i+1 < len(v); i += 2 {
		g.Demands = append(g.Demands, algo.SubscriberDemand{Subscriber: v[i], Demand: v[i+1]})
	}
	slices.SortFunc(g.Demands, func(a, b algo.SubscriberDemand) int {
		switch {
		case a.Subscriber < b.Subscriber:
			return -1
		case a.Subscriber > b.Subscriber:
			return 1
		}
		return 0
	})
	return g, v[2], nil
}
