package rlqs

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestUnknownDomainCounted: a stream of a domain not in the config, and
// one with no domain, are answered ALLOW_ALL, counted once each (however
// many reports they send) and logged; a known domain is not counted.
func TestUnknownDomainCounted(t *testing.T) {
	var unknown atomic.Int64
	var logs syncBuffer
	r := newRig(t, kindsConfig, nil, func(o *Options) {
		o.UnknownDomain = func() { unknown.Add(1) }
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	id := map[string]string{"api": "search"}
	for _, domain := range []string{"nope", "", "edge"} {
		c := r.open()
		c.send(domain, usage(id, 0, 1, 0))
		st := checkTTL(t, action(t, c.recv(), id), r.srv.TTL())
		want := "ALLOW_ALL"
		if domain == "edge" {
			want = "token_bucket"
		}
		if got := blanketOf(st); got != want {
			t.Errorf("domain %q: %s, want %s", domain, got, want)
		}
		c.send(domain, usage(id, 1e9, 1, 0))
	}
	waitFor(t, "reports processed", func() bool { return r.srv.reported.Load() == 6 })
	if n := unknown.Load(); n != 2 {
		t.Errorf("unknown domains counted %d, want 2 (one per stream)", n)
	}
	if !strings.Contains(logs.String(), "rlqs: stream of a domain not in the config") || !strings.Contains(logs.String(), `domain=nope `) {
		t.Errorf("no log line for the unknown domain: %q", logs.String())
	}
}
