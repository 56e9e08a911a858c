package client

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// Resyncer is implemented by a Limiter whose rate can follow the quota an
// upstream advertises (RateLimit-Policy, or a limit with a window).
type Resyncer interface {
	// Resync sets the limit to quota units per window, less margin.
	Resync(quota int64, window time.Duration, margin float64)
}

// Observe feeds the response of a call released by Wait back to the Pacer:
// the call is no longer in flight, and the upstream's rate-limit fields
// adjust what the next callers may send. Malformed fields are ignored, as
// the RateLimit draft requires. Retry-After (or a bare 429 or 503) holds
// every caller, RateLimit or X-RateLimit-* caps the calls before the reset,
// and RateLimit-Policy resyncs a Resyncer Limiter (docs/pacing.md).
//
// Observe cannot tell which call a response answers, so it may lower the
// calls left before the reset but raise them only once the reset has
// passed: an overtaken response must not reopen a spent quota. Transport
// knows, and lets a newer answer raise them at once.
func (p *Pacer) Observe(status int, h http.Header) {
	p.observe(ticket{}, status, h)
}

// observe is Observe for the call with the given ticket (zero: unknown).
// The answer to a call released after the gate was last set was produced
// after every answer seen so far, so it replaces the gate; any other answer
// may be older than the one the gate came from, and only lowers it.
func (p *Pacer) observe(tk ticket, status int, h http.Header) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight = max(p.inFlight-1, 0)
	p.answered += tk.units

	retry, hasRetry := retryAfter(h.Get("Retry-After"), now)
	r, t, quota, hasR := remaining(h, now)
	live := p.gate >= 0 && now.Before(p.gateEnd)
	fresh := tk.seq > p.gateSeq || !live
	if hasR && t > 0 {
		budget := max(r-int64(math.Floor(float64(r)*p.opt.Margin))-int64(p.inFlight), 0)
		end := now.Add(min(t, p.opt.MaxWait))
		switch {
		case fresh:
			if tk.seq != 0 && live && quota == p.gateQuota && p.sameWindow(r, now, t, quotaSize(h, quota)) && p.gateEnd.Before(end) {
				end = p.gateEnd
			}
			p.gate, p.gateEnd, p.gateR, p.gateQuota, p.gateSeq = budget, end, r, quota, p.released
			p.gateMark = 0
			if tk.seq != 0 {
				p.gateMark = tk.mark + tk.units
			}
			if r == 0 {
				p.hold(now, end.Sub(now), t)
			}
		case tk.seq == 0 && budget < p.gate:
			p.gate = budget
			if r == 0 {
				p.hold(now, t, t)
			}
		}
	}
	switch {
	case hasRetry:
		p.hold(now, retry, retry)
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		if !hasR || t <= 0 {
			p.hold(now, time.Second, time.Second)
		}
	}
	select { // let a caller waiting on the gate look again
	case p.reopen <- struct{}{}:
	default:
	}
	if rs, ok := p.opt.Limiter.(Resyncer); ok {
		if q, w, ok := policy(h); ok {
			rs.Resync(q, w, p.opt.Margin)
		}
	}
}

// sameWindow reports whether a fresh answer of the same quota as the one
// that last set the live gate (remaining r, reset t, seen at now; q the
// quota's size, 0 unknown) is from the same upstream window, so that the
// window still ends by gateEnd: t alone puts the reset up to a second
// after it is (whole seconds, rounded up), and an answer late in a
// per-second window, holding callers until now+t, would cover the whole
// next window.
//
// The units that can have reached the upstream between the two answers
// are at most those this pacer released and had not seen answered when the
// gate's call went, other than that call. Had the window reset in between,
// the new window would have counted no more than those, leaving at least
// its size (q, and more than gateR) less them; a lower remaining is the
// same window. The remaining must also have fallen (an upstream whose
// remaining refills has no window to bound), and the reset t gives must
// be able to fall by gateEnd. Another client of the same quota can fool
// the count; the margin and the upstream's Retry-After cover that.
func (p *Pacer) sameWindow(r int64, now time.Time, t time.Duration, q int64) bool {
	if p.gateMark == 0 || p.sent < p.gateMark || r >= p.gateR {
		return false
	}
	between := int64(min(p.sent-p.gateMark, math.MaxInt64/2))
	return r+between < max(p.gateR+1, q) && p.gateEnd.After(now.Add(t-time.Second))
}

// quotaSize returns q of the RateLimit-Policy item named name, or 0.
func quotaSize(h http.Header, name string) int64 {
	vs := h.Values("RateLimit-Policy")
	if name == "" || len(vs) == 0 {
		return 0
	}
	l, err := httpsfv.UnmarshalList(vs)
	if err != nil {
		return 0
	}
	for _, m := range l {
		if it, isItem := m.(httpsfv.Item); isItem && quotaName(it.Value) == name {
			if q, ok := intParam(it.Params, "q"); ok {
				return q
			}
		}
	}
	return 0
}

// hold keeps every caller back until now+d plus a random share, up to
// Jitter, of spread (the wait the upstream asked for, so that paced clients
// spread as widely however early the pacer knows the reset), unless a
// later hold is already set.
func (p *Pacer) hold(now time.Time, d, spread time.Duration) {
	jitter := time.Duration(rand.Float64() * p.opt.Jitter * float64(min(spread, p.opt.MaxWait)))
	till := now.Add(min(d, p.opt.MaxWait) + jitter)
	if till.After(p.holdTill) {
		p.holdTill = till
	}
}

// retryAfter parses Retry-After: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, math.MaxInt64/int64(time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// remaining returns the tightest remaining quota, the time until more
// becomes available and the quota's name in RateLimit, from RateLimit, or
// else from X-RateLimit-Remaining and X-RateLimit-Reset (or their
// unprefixed draft names; the name is then empty).
func remaining(h http.Header, now time.Time) (r int64, t time.Duration, name string, ok bool) {
	if vs := h.Values("RateLimit"); len(vs) > 0 {
		if l, err := httpsfv.UnmarshalList(vs); err == nil {
			for _, m := range l {
				it, isItem := m.(httpsfv.Item)
				if !isItem {
					continue
				}
				ri, okR := intParam(it.Params, "r")
				if !okR {
					continue
				}
				ti, _ := intParam(it.Params, "t")
				if !ok || ri < r {
					r, t, ok = ri, time.Duration(ti)*time.Second, true
					name = quotaName(it.Value)
				}
			}
			if ok {
				return r, t, name, true
			}
		}
	}
	for _, prefix := range []string{"X-RateLimit-", "RateLimit-"} {
		rv, rerr := firstInt(h.Get(prefix + "Remaining"))
		tv, terr := firstInt(h.Get(prefix + "Reset"))
		if rerr != nil || terr != nil || rv < 0 || tv < 0 {
			continue
		}
		if tv > 1_000_000_000 { // an epoch time, as some APIs send
			return rv, max(time.Unix(tv, 0).Sub(now), 0), "", true
		}
		return rv, time.Duration(tv) * time.Second, "", true
	}
	return 0, 0, "", false
}

// quotaName returns a RateLimit item's name: a string or a token.
func quotaName(v any) string {
	switch n := v.(type) {
	case string:
		return n
	case httpsfv.Token:
		return string(n)
	}
	return ""
}

// policy returns the quota policy with the lowest rate from
// RateLimit-Policy, or else from X-RateLimit-Limit items with a w
// parameter ("10, 10;w=1").
func policy(h http.Header) (q int64, w time.Duration, ok bool) {
	best := math.Inf(1)
	consider := func(qi, wi int64) {
		if qi < 0 || wi <= 0 {
			return
		}
		if rate := float64(qi) / float64(wi); rate < best {
			best, q, w, ok = rate, qi, time.Duration(wi)*time.Second, true
		}
	}
	if vs := h.Values("RateLimit-Policy"); len(vs) > 0 {
		if l, err := httpsfv.UnmarshalList(vs); err == nil {
			for _, m := range l {
				if it, isItem := m.(httpsfv.Item); isItem {
					qi, okQ := intParam(it.Params, "q")
					wi, okW := intParam(it.Params, "w")
					if okQ && okW {
						consider(qi, wi)
					}
				}
			}
		}
		if ok {
			return q, w, true
		}
	}
	if vs := h.Values("X-RateLimit-Limit"); len(vs) > 0 {
		if l, err := httpsfv.UnmarshalList(vs); err == nil {
			for _, m := range l {
				if it, isItem := m.(httpsfv.Item); isItem {
					qi, okQ := it.Value.(int64)
					wi, okW := intParam(it.Params, "w")
					if okQ && okW {
						consider(qi, wi)
					}
				}
			}
		}
	}
	return q, w, ok
}

func intParam(ps *httpsfv.Params, name string) (int64, bool) {
	if ps == nil {
		return 0, false
	}
	v, ok := ps.Get(name)
	if !ok {
		return 0, false
	}
	i, ok := v.(int64)
	return i, ok && i >= 0
}

// firstInt parses the leading integer of a field ("7" or "10, 10;w=1").
func firstInt(v string) (int64, error) {
	v, _, _ = strings.Cut(v, ",")
	v, _, _ = strings.Cut(v, ";")
	return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
}
