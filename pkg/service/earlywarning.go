package service

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// observeEarlyWarnings counts in ratelimitd_early_warning_total the keys
// whose usage crossed their limit's early warning share (Spec.EarlyWarning)
// with this request while less than Within of the window had passed: a key
// on course to use several times its limit. It reads only the decision and
// the window position, so it costs the store nothing; only the crossing
// hit counts, and denied requests (which consumed nothing) are skipped
// except in global shadow mode. A sampled log line names the key by hash.
func (s *Service) observeEarlyWarnings(domain string, ds []descState, hits []algo.Hit, decs []algo.Decision, outs []outcome, denied bool) {
	if denied && !s.opts.ShadowMode {
		return
	}
	var now time.Time
	for i := range ds {
		st := &ds[i]
		if st.override || st.refund || st.match.Release || st.match.Rule == nil {
			continue
		}
		for _, a := range st.applied {
			ew := a.spec.EarlyWarning
			if ew.Used <= 0 || (outs[a.hit] != byStore && outs[a.hit] != byFallback) {
				continue
			}
			if a.spec.Consistency == policy.Leased && s.opts.Leases != nil {
				// The decision holds the instance's units, not what
				// the key used: nothing to read the crossing from.
				continue
			}
			d := decs[a.hit]
			limit := int64(a.spec.RequestsPerUnit)
			if !d.Allowed || limit <= 0 {
				continue
			}
			used := limit - d.Remaining
			share := ew.Used * float64(limit)
			if !(float64(used) > share && float64(used-st.cost) <= share) {
				continue
			}
			if now.IsZero() {
				now = s.opts.Now()
			}
			elapsed, window, ok := windowElapsed(a.spec.Limit, d, now)
			if !ok || float64(elapsed) >= ew.Within*float64(window) {
				continue
			}
			rule := st.match.Rule.Path
			s.m.earlyWarnings.WithLabelValues(domain, rule).Inc()
			if ok, n := s.errLog.Allow("early_warning\x00"+domain+"\x00"+rule, now); ok {
				sum := sha256.Sum256([]byte(hits[a.hit].Key))
				s.opts.Logger.Warn("early warning: a key used more than its share of a limit early in the window",
					"domain", domain, "rule", rule, "key_hash", hex.EncodeToString(sum[:8]), "used", used, "limit", limit,
					"elapsed", elapsed, "window", window, "suppressed", n)
			}
		}
	}
}

// windowElapsed is how far into its current window an admitted hit of lim
// was decided, and that window's length, derived from the store's reset
// time (its own clock). A sliding window's state lasts until the end of the
// next window, so two window lengths are counted; a calendar window's
// length is that of the month or year holding now. ok is false for
// algorithms without windows.
func windowElapsed(lim algo.Limit, d algo.Decision, now time.Time) (elapsed, window time.Duration, ok bool) {
	if lim.Kind != algo.FixedWindow && lim.Kind != algo.SlidingWindow {
		return 0, 0, false
	}
	window, next := lim.Period, lim.Period
	if lim.Calendar != algo.CalendarNone {
		start, end := algo.WindowBoundsUs(lim, now.UnixMicro())
		_, nextEnd := algo.WindowBoundsUs(lim, end)
		window, next = time.Duration(end-start)*time.Microsecond, time.Duration(nextEnd-end)*time.Microsecond
	}
	left := d.ResetAfter
	if lim.Kind == algo.SlidingWindow {
		left -= next
	}
	return min(max(window-left, 0), window), window, true
}
