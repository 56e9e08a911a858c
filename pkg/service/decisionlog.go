package service

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// DecisionLogMode selects the decisions the decision log writes
// (--log-decisions). The zero value DecisionLogOff writes none.
type DecisionLogMode uint8

const (
	// DecisionLogOff writes no decision lines.
	DecisionLogOff DecisionLogMode = iota
	// DecisionLogDenied writes a line for each request with a denied
	// descriptor (OVER_LIMIT, shadow mode denials included).
	DecisionLogDenied
	// DecisionLogAll writes a line for every decided request.
	DecisionLogAll
)

// String returns the flag spelling: "off", "denied" or "all".
func (m DecisionLogMode) String() string { return decisionLogModes.String(m) }

// decisionLogModes are the spellings of DecisionLogMode.
var decisionLogModes = flagEnum[DecisionLogMode]{typ: "DecisionLogMode", what: "decision log mode", names: []string{"off", "denied", "all"}}

// ParseDecisionLogMode parses "off", "denied" or "all" (case-insensitive;
// "" means off).
func ParseDecisionLogMode(s string) (DecisionLogMode, error) { return decisionLogModes.Parse(s) }

// DefaultDecisionLogRate is the default bound of the decision log, in
// lines per second (Options.DecisionLogRate).
const DefaultDecisionLogRate = 100

// lineBucket is a token bucket of log lines: capacity max(rate, 1),
// refilled at rate per second; lines beyond it are counted, and the next line that
// passes reports how many were suppressed since the previous one. Safe
// for concurrent use.
type lineBucket struct {
	mu         sync.Mutex
	rate       float64 // lines per second
	capacity   float64 // max(rate, 1)
	tokens     float64
	last       time.Time
	suppressed int64
}

func newLineBucket(rate float64, now time.Time) *lineBucket {
	c := max(rate, 1)
	return &lineBucket{rate: rate, capacity: c, tokens: c, last: now}
}

// take reports whether a line may be written at now and, when it may,
// how many lines were suppressed before it.
func (b *lineBucket) take(now time.Time) (bool, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(b.capacity, b.tokens+el.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}

// logDecision writes the decision log line of one decided request (see
// Options.DecisionLog): msg "decision", attributes domain, code (the
// overall code before global shadow mode), rules (per descriptor, its
// rule's stat key, "" when none matched), statuses (per descriptor code),
// remaining (per descriptor limit_remaining), keys (the backend keys of
// the applied limits, hashed unless --key-values=clear), entries (per
// descriptor "k=v,..." only with Options.LogValues) and suppressed (lines
// the rate bound dropped since the previous line).
func (s *Service) logDecision(req *rlsv3.RateLimitRequest, ds []descState, hits []string, resp *rlsv3.RateLimitResponse, denied bool) {
	if s.opts.DecisionLog == DecisionLogDenied {
		some := false
		for i := range ds {
			some = some || ds[i].denied
		}
		if !some {
			return
		}
	}
	ok, suppressed := s.dlog.take(s.opts.Now())
	if !ok {
		s.m.decisionLogSuppressed.Inc()
		return
	}
	code := rlsv3.RateLimitResponse_OK
	if denied {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	rules := make([]string, len(ds))
	statuses := make([]string, len(ds))
	remaining := make([]uint32, len(ds))
	for i := range ds {
		if ds[i].matched {
			rules[i] = ds[i].match.Rule.Path
			if ds[i].override {
				rules[i] = LabelOverride
			}
		}
		if i < len(resp.GetStatuses()) {
			statuses[i] = resp.GetStatuses()[i].GetCode().String()
			remaining[i] = resp.GetStatuses()[i].GetLimitRemaining()
		}
	}
	attrs := []slog.Attr{
		slog.String("domain", req.GetDomain()),
		slog.String("code", code.String()),
		slog.Any("rules", rules),
		slog.Any("statuses", statuses),
		slog.Any("remaining", remaining),
		slog.Any("keys", hits),
	}
	if s.opts.LogValues {
		attrs = append(attrs, slog.Any("entries", descriptorList(req, s.entryList)))
	}
	attrs = append(attrs, slog.Int64("suppressed", suppressed))
	s.opts.Logger.LogAttrs(context.Background(), slog.LevelInfo, "decision", attrs...)
}

// entryList gives a descriptor's entries for logs and explanations: the
// keys only, or "key=value" with Options.LogValues.
func (s *Service) entryList(es []*ratelimitv3.RateLimitDescriptor_Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.GetKey()
		if s.opts.LogValues {
			out[i] += "=" + e.GetValue()
		}
	}
	return out
}

// descriptorList is entryList of every descriptor of req, each joined by
// commas.
func descriptorList(req *rlsv3.RateLimitRequest, f func([]*ratelimitv3.RateLimitDescriptor_Entry) []string) []string {
	out := make([]string, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		out[i] = strings.Join(f(d.GetEntries()), ",")
	}
	return out
}
