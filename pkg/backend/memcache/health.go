// Health: what calls and the background probe learn about memcached.

package memcache

import (
	"context"
	"errors"
	"time"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
)

// Healthy reports whether memcached is answering (service.Healther): true
// once a call or probe succeeded, false from an outage error until the next
// success and while the breaker (one server only) is not closed. Without
// traffic the probe asks every server for its version every
// Options.HealthInterval, so one server of several down is unhealthy too:
// the keys it holds cannot be counted.
func (s *Store) Healthy() bool {
	return s.warmed.Load() && !s.unhealthy.Load() && (!s.guarded() || s.breaker.Healthy())
}

func (s *Store) note(err error) {
	if err == nil {
		if !s.warmed.Load() {
			s.warmed.Store(true)
		}
		if s.unhealthy.Load() {
			s.unhealthy.Store(false)
		}
		return
	}
	var e *Error
	if errors.As(err, &e) && e.Outage() {
		s.unhealthy.Store(true)
	}
}

func (s *Store) probeLoop() {
	defer s.wg.Done()
	for {
		// While the circuit is closed the probe pings beside the
		// breaker (only decisions open it); while it is not, through
		// it: refused while open, a half-open probe after OpenFor that
		// closes it when memcached answers, so that an idle Store
		// recovers without traffic.
		var err error
		if !s.guarded() || s.breaker.Healthy() {
			err = s.ping()
		} else {
			err = s.breaker.Do(context.Background(), 0, func(context.Context) error { return s.ping() })
		}
		s.note(err)
		d := s.opts.HealthInterval
		if err != nil {
			d = min(d, unhealthyProbeInterval)
		}
		if !s.waitTimer(s.clk.NewTimer(d)) {
			return
		}
	}
}

// wait waits d of the real clock; it reports false, early, when the Store
// is closed.
func (s *Store) wait(d time.Duration) bool { return s.waitTimer(bclock.System{}.NewTimer(d)) }

// waitTimer is wait until t fires (the probe's timer is on s.clk).
func (s *Store) waitTimer(t bclock.Timer) bool {
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-t.C():
		return true
	}
}

// ping asks every server for its version (each bounded by Timeout).
func (s *Store) ping() error {
	if !s.resolved.Load() {
		return newError(CauseRefused, true, gomemcache.ErrNoServers)
	}
	return Classify(s.client.Ping())
}
