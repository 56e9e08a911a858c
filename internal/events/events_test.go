package events_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/events"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

var (
	errOpen    = errors.New("open")
	errStalled = errors.New("stalled open")
	errDown    = errors.New("refused")
)

func outcome(err error) breaker.Outcome {
	switch err {
	case nil:
		return breaker.Answered
	case errDown:
		return breaker.Failed
	}
	return breaker.Neutral
}

// TestOpenForOnTheBreakersClock: the still-open and closed lines give
// open_for as the time the breaker's own clock moved since the circuit
// opened, whatever that clock is: here years away from the real
// time, which only the breaker reads.
func TestOpenForOnTheBreakersClock(t *testing.T) {
	for _, c := range []struct {
		name  string
		start time.Time
	}{
		{"clock behind the real time", time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"clock ahead of the real time", time.Now().AddDate(1, 0, 0)},
	} {
		logs := &testproc.Buffer{}
		ev := events.New(slog.New(slog.NewJSONHandler(logs, nil)), "redis")
		o := breaker.DefaultOptions()
		o.Failures, o.ReportEvery, o.OnReport = 1, time.Minute, ev.OnReport
		now := c.start
		b := breaker.New(o, breaker.Errors{Open: errOpen, StalledOpen: errStalled, Outcome: outcome}, func() time.Time { return now })
		call := func(err error) {
			t.Helper()
			if e := b.Allow(now); e != nil {
				t.Fatalf("%s: at %v: %v", c.name, now.Sub(c.start), e)
			}
			b.Record(now, err)
		}
		call(errDown) // opens
		// A failed half-open probe every OpenFor for 90 s: one still-open
		// line, a minute in.
		for now.Sub(c.start) < 90*time.Second {
			now = now.Add(o.OpenFor)
			call(errDown)
		}
		stillFor := (time.Minute + o.OpenFor - 1) / o.OpenFor * o.OpenFor // the first probe ReportEvery in
		now = now.Add(o.OpenFor)
		call(nil) // closes
		want := map[string]time.Duration{
			"backend circuit still open": stillFor,
			"backend circuit closed":     now.Sub(c.start),
		}
		seen := 0
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec struct {
				Msg     string `json:"msg"`
				OpenFor string `json:"open_for"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("%s: %v: %s", c.name, err, line)
			}
			for prefix, d := range want {
				if !strings.HasPrefix(rec.Msg, prefix) {
					continue
				}
				seen++
				if got, err := time.ParseDuration(rec.OpenFor); err != nil || got != d {
					t.Errorf("%s: %q: open_for %q, want %v (the breaker's clock)", c.name, prefix, rec.OpenFor, d)
				}
			}
		}
		if seen != len(want) {
			t.Errorf("%s: %d of the still-open and closed lines, want one of each:\n%s", c.name, seen, logs.String())
		}
	}
}
