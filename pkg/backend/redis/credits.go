package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// The local over-limit cache stays exact across replicas through one
// Redis pub/sub channel (Options.CreditChannel): only a credit can make a
// cached denial wrong early, so every refund, Cluster compensating refund
// and Reset publishes the keys it credited, and every Store drops the keys
// it receives from its cache. The cache answers only while the
// subscription is confirmed; a lost, failed or silent one flushes and
// suspends it (overlimit.Cache.Suspend). Keys are published as stored,
// already hashed where sensitive.

const (
	// DefaultLocalCacheSize is ratelimitd's default --local-cache-size on
	// Redis in native mode (Options.LocalCacheSize stays 0 unless set).
	DefaultLocalCacheSize = 10000
	// DefaultCreditChannel is Options.CreditChannel when empty.
	DefaultCreditChannel = "ratelimitd:credited"
	// creditPingAfter is how long the subscription may stay silent before
	// it is PINGed, and how long the PING may go unanswered before the
	// subscription is given up (cache suspended) and dialed again.
	creditPingAfter = time.Second
	// creditRetry is the first pause before subscribing again after a
	// failure; it doubles with every failure in a row up to creditRetryMax
	// (each attempt dials, and failed dials count toward go-redis' pool
	// backoff).
	creditRetry    = 100 * time.Millisecond
	creditRetryMax = time.Second
)

// credits is a Store's subscription to the credit channel.
type credits struct {
	channel string
	stop    context.CancelFunc
	done    chan struct{}
	// received counts the credited keys received; lost the times the
	// subscription was lost after being confirmed.
	received atomic.Uint64
	lost     atomic.Uint64
	// mu guards changed (closed and replaced whenever the subscription's
	// state or received changes, see Store.creditsChanged), live and ps.
	mu      sync.Mutex
	changed chan struct{}
	live    bool            // the subscription is confirmed and the cache answers
	ps      *goredis.PubSub // the current subscription; nil once stopped
	stopped bool
}

// startCredits suspends the cache and subscribes to the credit channel in
// the background (no-op without a cache).
func (s *Store) startCredits() {
	if s.cache == nil {
		return
	}
	s.cache.Suspend()
	ch := s.opts.CreditChannel
	if ch == "" {
		ch = DefaultCreditChannel
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &credits{channel: ch, stop: stop, done: make(chan struct{}), changed: make(chan struct{})}
	s.credits = c
	go func() {
		defer close(c.done)
		pause := creditRetry
		for ctx.Err() == nil {
			ps := s.client.Subscribe(ctx, ch)
			c.mu.Lock()
			if c.stopped {
				c.mu.Unlock()
				_ = ps.Close()
				return
			}
			c.ps = ps
			c.mu.Unlock()
			if s.followCredits(ctx, ps) {
				pause = creditRetry
			}
			_ = ps.Close()
			s.setCreditsLive(false)
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			pause = min(2*pause, creditRetryMax)
		}
	}()
}

// followCredits reads ps until it fails or goes silent: a confirmed
// subscription resumes the cache, each message drops its key. It reports
// whether the subscription was confirmed.
func (s *Store) followCredits(ctx context.Context, ps *goredis.PubSub) (confirmed bool) {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, creditPingAfter)
		if err != nil {
			var ne net.Error
			if pinged || !errors.As(err, &ne) || !ne.Timeout() {
				return confirmed
			}
			if ps.Ping(ctx) != nil {
				return confirmed
			}
			pinged = true
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" && m.Channel == s.credits.channel {
				confirmed = true
				s.setCreditsLive(true)
			}
		case *goredis.Message:
			s.cache.Invalidate(m.Payload)
			s.credits.received.Add(1)
			s.creditsNotify()
		}
	}
}

// setCreditsLive resumes (live) or suspends the cache.
func (s *Store) setCreditsLive(live bool) {
	c := s.credits
	c.mu.Lock()
	if c.live == live {
		c.mu.Unlock()
		return
	}
	c.live = live
	if !live {
		c.lost.Add(1)
	}
	c.mu.Unlock()
	if live {
		s.cache.Resume()
	} else {
		s.cache.Suspend()
	}
	s.creditsNotify()
}

// creditsNotify wakes the waiters of creditsChanged.
func (s *Store) creditsNotify() {
	c := s.credits
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// creditsChanged is closed at the next change of the subscription's state
// or of the credits received (nil without a cache).
func (s *Store) creditsChanged() <-chan struct{} {
	if s.credits == nil {
		return nil
	}
	s.credits.mu.Lock()
	defer s.credits.mu.Unlock()
	return s.credits.changed
}

// CreditsLive reports whether the local over-limit cache is answering:
// its subscription to the credit channel is confirmed (false when the
// cache is disabled).
func (s *Store) CreditsLive() bool {
	if s.credits == nil {
		return false
	}
	s.credits.mu.Lock()
	defer s.credits.mu.Unlock()
	return s.credits.live
}

// waitCredits waits until the cache answers (see CreditsLive) or ctx
// ends; it returns at once without a cache.
func (s *Store) waitCredits(ctx context.Context) error {
	if s.credits == nil {
		return nil
	}
	for {
		ch := s.creditsChanged()
		if s.CreditsLive() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// CreditPublishErrors is the number of credit publications that failed:
// after each, other replicas may deny a credited key until their cached
// RetryAfter (never admit more than Redis would).
func (s *Store) CreditPublishErrors() uint64 { return s.creditPublishErrors.Load() }

// stopCredits ends the subscription and waits for its reader.
func (s *Store) stopCredits() {
	c := s.credits
	if c == nil {
		return
	}
	c.stop()
	c.mu.Lock()
	c.stopped = true
	if c.ps != nil {
		_ = c.ps.Close() // ends a blocked ReceiveTimeout
	}
	c.mu.Unlock()
	<-c.done
}

// publishCredits publishes the keys of hits that credited their key
// (credited reports which), after they were sent; in the background under
// Options.Timeout, so that no caller waits on it. Without a cache of its
// own the Store still publishes: other replicas may cache.
func (s *Store) publishCredits(hits []algo.Hit, credited func(algo.Hit) bool) {
	var keys []string
	for _, h := range hits {
		if h.Limit.Kind != algo.Concurrency && credited(h) {
			keys = append(keys, h.Key)
		}
	}
	if len(keys) == 0 {
		return
	}
	ch := s.opts.CreditChannel
	if ch == "" {
		ch = DefaultCreditChannel
	}
	s.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, k := range keys {
				p.Publish(ctx, ch, k)
			}
			return nil
		})
		if err != nil {
			s.creditPublishErrors.Add(1)
		}
	})
}
