package rlqs

// silentAfter is how many intervals a bucket may go without a report
// before its demand counts as none: Envoy reports every bucket every
// interval, so a bucket silent for two has an Envoy that is gone or
// stalled, or a client that holds a stream without reporting. Its share
// then goes to the streams that report (AbandonAfter forgets the bucket
// much later).
const silentAfter = 2

// idleTokens is the bucket of a stream without demand (silent, or
// reporting no requests): one token, refilled at no rate (a token a day,
// tokenBucket), so it admits a request or so, which its next report shows
// as demand. It takes nothing from the headroom the demanding streams'
// buckets share: an Envoy's bucket refills only at its rate, so a stream
// assigned no rate admits at most that one token until it reports demand.
const idleTokens = 1

// silent reports whether b has not been reported for silentAfter intervals.
func (s *Server) silent(b *bucket) bool {
	return s.now().Sub(b.last) >= silentAfter*s.opt.Interval
}

// demanding is the number of streams of fleet (subscriber -> demand) with
// demand or whose demand is not known yet: those among which planFor
// divides the headroom (at least 1).
func demanding(fleet map[string]int64) int {
	n := 0
	for _, d := range fleet {
		if d != 0 {
			n++
		}
	}
	return max(n, 1)
}
