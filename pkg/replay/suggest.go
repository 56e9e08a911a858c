package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// SuggestOptions configure Suggest. The zero value uses the defaults.
type SuggestOptions struct {
	// Load are the options the config (Options.Policy) was loaded with;
	// the candidate configs are loaded with them.
	Load policy.LoadOptions
	// ReadFile reads a config file named by policy.Rule.File (default
	// os.ReadFile). The candidate configs and the fragment are these
	// files with the limits rewritten.
	ReadFile func(name string) ([]byte, error)
	// Factor is the suggested limit as a multiple of the p99 of the
	// legitimate keys' peaks (default 2.5; from 2 to 3).
	Factor float64
	// MinKeys: a class with fewer legitimate keys gets no suggestion
	// (default 20).
	MinKeys int
	// FewKeys: a suggestion on fewer legitimate keys is flagged (default
	// 100).
	FewKeys int
	// MinSpan: a suggestion on less log time is flagged (default 24h).
	MinSpan time.Duration
	// Outlier: a key whose peak is above Outlier × the p99 of the keys
	// not denied persistently is set aside (default 10).
	Outlier float64
	// NewStore returns an empty store reading its clock from now and a
	// function that closes it; each candidate is replayed on a new one.
	// Required.
	NewStore func(now func() time.Time) (service.Store, func(), error)
	// BurstShare is the token-bucket burst as a share of the suggested
	// per-minute rate (default 0.2; from 0.1 to 0.2); the observed p99 of
	// the keys' busiest second wins when larger.
	BurstShare float64
}

func (o *SuggestOptions) defaults() {
	if o.ReadFile == nil {
		o.ReadFile = os.ReadFile
	}
	if o.Factor == 0 {
		o.Factor = 2.5
	}
	if o.MinKeys == 0 {
		o.MinKeys = 20
	}
	if o.FewKeys == 0 {
		o.FewKeys = 100
	}
	if o.MinSpan == 0 {
		o.MinSpan = 24 * time.Hour
	}
	if o.Outlier == 0 {
		o.Outlier = 10
	}
	if o.BurstShare == 0 {
		o.BurstShare = 0.2
	}
}

// Suggestion is the outcome of replay --suggest: per rule (key class) the
// distribution of peak usage over keys, a suggested limit, and what each
// candidate limit would have done; and the config with the suggested
// limits, every rule in shadow mode.
type Suggestion struct {
	// Span is the log time the suggestion saw (Report.Last - First).
	Span Duration `json:"span"`
	// Factor is SuggestOptions.Factor.
	Factor float64 `json:"factor"`
	// AbuseRule states how keys were set aside as abusive.
	AbuseRule string `json:"abuse_rule"`
	// Classes are the rules with a counted limit that answered at least
	// one descriptor, ordered by domain, then path.
	Classes []ClassSuggestion `json:"classes"`
	// Fragments are the config files holding a suggested rule, rewritten:
	// suggested limits, every counted rule shadow_mode: true.
	Fragments []Fragment `json:"fragments,omitempty"`
	// Notes are rules the fragment could not rewrite, and why.
	Notes []string `json:"notes,omitempty"`
}

// Duration is a time.Duration that reads as "72h0m0s" in JSON.
type Duration time.Duration

// MarshalText renders d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Fragment is one rewritten config file.
type Fragment struct {
	// File is the config file (policy.Rule.File).
	File string `json:"file"`
	// YAML is the file with the suggested limits.
	YAML string `json:"yaml"`
}

// ClassSuggestion is the suggestion for one rule: its keys are the request
// descriptors' entries that matched it (per IP, per API key, per route...).
type ClassSuggestion struct {
	// Domain is the domain the rule's descriptors were sent under.
	Domain string `json:"domain"`
	// Rule is the rule's stat key (policy.Rule.Path).
	Rule string `json:"rule"`
	// Limit is the index of the limit in the rule's rate_limits (0 for
	// rate_limit): every limit of a rule is a class of its own, with its
	// own window, distribution and suggestion.
	Limit int `json:"limit,omitempty"`
	// Of is the rule's number of limits when it has several (else 0).
	Of int `json:"of,omitempty"`
	// Current is the limit as configured.
	Current string `json:"current"`
	// Window is that limit's window ("1m0s").
	Window Duration `json:"window"`
	// Keys is the number of distinct keys that reached the rule.
	Keys int `json:"keys"`
	// Requests is the number of requests that reached the rule.
	Requests int `json:"requests"`
	// Legitimate is the number of keys left once the abusive ones are
	// set aside.
	Legitimate int `json:"legitimate"`
	// Peaks is the distribution over legitimate keys of each key's peak
	// usage (cost) per window.
	Peaks Distribution `json:"peaks"`
	// Abusive are the keys set aside, most requests first (at most 20).
	Abusive []AbusiveKey `json:"abusive,omitempty"`
	// AbusiveKeys is the number of keys set aside (all of them).
	AbusiveKeys int `json:"abusive_keys"`
	// AbusiveRequests is their number of requests to the rule.
	AbusiveRequests int `json:"abusive_requests"`
	// Suggested is the suggested requests_per_unit (0 when Refused).
	Suggested int64 `json:"suggested,omitempty"`
	// Burst is the token-bucket burst for Suggested: BurstShare of its
	// per-minute rate, or BurstP99 when larger.
	Burst int64 `json:"burst,omitempty"`
	// BurstP99 is the p99 over legitimate keys of their busiest second.
	BurstP99 int64 `json:"burst_p99"`
	// Refused says why there is no suggestion ("" when there is one).
	Refused string `json:"refused,omitempty"`
	// Flags are caveats of the suggestion (short log, few keys).
	Flags []string `json:"flags,omitempty"`
	// Windows, for a rule still to be written (an unlimited rule), are the
	// peaks and suggested limits per minute, hour and day (Peaks and
	// Suggested are the minute's); such a rule has no candidates and the
	// fragment leaves it as it is.
	Windows []WindowSuggestion `json:"windows,omitempty"`
	// Candidates are what each candidate limit would have done, each
	// replayed with every rule in shadow mode.
	Candidates []Candidate `json:"candidates,omitempty"`

	window   int64
	tb       bool  // the limit is a token bucket
	curLimit int64 // its requests_per_unit
	curBurst int64 // its burst (token bucket), else 0
}

// WindowSuggestion is the distribution and suggestion for one window of a
// rule still to be written.
type WindowSuggestion struct {
	// Window is the window ("1h0m0s").
	Window Duration `json:"window"`
	// Peaks is the distribution over legitimate keys of their peak per
	// Window.
	Peaks Distribution `json:"peaks"`
	// Suggested is Factor × Peaks.P99, rounded up.
	Suggested int64 `json:"suggested"`
}

// Distribution summarises per-key peaks (nearest-rank percentiles).
type Distribution struct {
	// P50 is the median peak (units of cost per window).
	P50 int64 `json:"p50"`
	// P95 is the 95th percentile peak.
	P95 int64 `json:"p95"`
	// P99 is the 99th percentile peak, the base of the suggestion.
	P99 int64 `json:"p99"`
	// P999 is the 99.9th percentile peak (the max below 1000 keys).
	P999 int64 `json:"p99_9"`
	// Max is the largest peak.
	Max int64 `json:"max"`
}

// AbusiveKey is a key set aside from the legitimate distribution.
type AbusiveKey struct {
	// Key is the descriptor's entries ("remote_address=192.0.2.1").
	Key string `json:"key"`
	// Requests is the key's number of requests to the rule.
	Requests int `json:"requests"`
	// Peak is its busiest window (units of cost).
	Peak int64 `json:"peak"`
	// Reason says which rule set it aside, with its numbers.
	Reason string `json:"reason"`
}

// Candidate is one limit replayed for a rule.
type Candidate struct {
	// Name is "current", "suggested" or "N× p99".
	Name string `json:"name"`
	// Limit is the candidate requests_per_unit.
	Limit int64 `json:"limit"`
	// Burst is its token-bucket burst (0 for other algorithms).
	Burst int64 `json:"burst,omitempty"`
	// LegitDenied is the number of legitimate keys' requests it denied.
	LegitDenied int `json:"legit_denied"`
	// LegitShare is LegitDenied over the legitimate keys' requests (the
	// false-positive rate).
	LegitShare float64 `json:"legit_share"`
	// LegitKeysDenied is the number of legitimate keys denied at least
	// once.
	LegitKeysDenied int `json:"legit_keys_denied"`
	// LegitKeyShare is LegitKeysDenied over the legitimate keys.
	LegitKeyShare float64 `json:"legit_key_share"`
	// AbusiveDenied is the number of abusive keys' requests it denied.
	AbusiveDenied int `json:"abusive_denied"`
	// AbusiveShare is AbusiveDenied over the abusive keys' requests.
	AbusiveShare float64 `json:"abusive_share"`
	// Denied counts every request the rule would deny (all keys).
	Denied int `json:"denied"`
}

// candidate kinds, in report order.
var candidateNames = []string{"current", "suggested", "1x p99", "2x p99", "3x p99", "5x p99"}
var candidateFactors = []float64{0, 0, 1, 2, 3, 5}

// Suggest replays lines as RunLines does and adds the suggestion
// (Report.Suggestion): the replay with opts (on opts.Store) is the
// baseline that sets abusive keys aside; then every candidate limit is
// replayed with every rule in shadow mode (global shadow mode) on a new
// store from so.NewStore, so that each rule sees all its traffic.
func Suggest(ctx context.Context, lines []LogLine, bad []Malformed, opts Options, so SuggestOptions) (*Report, error) {
	so.defaults()
	if so.NewStore == nil {
		return nil, errors.New("replay: SuggestOptions.NewStore is required")
	}
	base := newUsage()
	rep, err := runLines(ctx, lines, bad, opts, base)
	if err != nil {
		return nil, err
	}
	sg := &Suggestion{
		Span:   Duration(rep.Last.Sub(rep.First)),
		Factor: so.Factor,
		AbuseRule: fmt.Sprintf("a key is set aside as abusive when the current config denied at least half of its requests to the rule, "+
			"or denied it in 3 or more windows, or when its peak is above %g× the p99 of the other keys", so.Outlier),
	}
	var classes []*ClassSuggestion
	legit := map[string]map[string]bool{}
	for _, id := range sortedIDs(base) {
		cu := base.classes[id]
		if !counted(cu.rule, cu.limit) && !cu.toWrite {
			continue
		}
		cs, lk := analyse(cu, so, time.Duration(sg.Span))
		classes = append(classes, cs)
		legit[id] = lk
	}
	files, err := configFiles(opts.Policy, so)
	if err != nil {
		return nil, err
	}
	replayed := slices.ContainsFunc(classes, func(cs *ClassSuggestion) bool { return cs.Refused == "" && len(cs.Windows) == 0 })
	for ci, name := range candidateNames {
		if !replayed {
			break // no class to replay candidates for
		}
		changes := map[string]limitChange{}
		for _, cs := range classes {
			if cs.Refused != "" || len(cs.Windows) > 0 {
				continue
			}
			if lim, burst, ok := cs.candidateLimit(ci, so); ok {
				changes[classID(cs.Domain, cs.Rule, cs.Limit)] = limitChange{limit: lim, burst: burst}
			}
		}
		srcs, notes, err := rewrite(files, opts.Policy, changes, ci == 1)
		if err != nil {
			return nil, err
		}
		if ci == 1 {
			sg.Notes = notes
			for _, s := range srcs {
				if s.changed {
					sg.Fragments = append(sg.Fragments, Fragment{File: s.Name, YAML: string(s.Data)})
				}
			}
		}
		use, err := replayCandidate(ctx, lines, opts, so, srcs)
		if err != nil {
			return nil, fmt.Errorf("replay --suggest: candidate %s: %w", name, err)
		}
		for _, cs := range classes {
			if cs.Refused != "" || len(cs.Windows) > 0 {
				continue
			}
			id := classID(cs.Domain, cs.Rule, cs.Limit)
			lim, burst, _ := cs.candidateLimit(ci, so)
			cs.Candidates = append(cs.Candidates, score(name, lim, burst, use.classes[id], legit[id]))
		}
	}
	for _, cs := range classes {
		if len(cs.Candidates) > 1 && cs.Candidates[1].LegitShare > 0.001 {
			cs.Flags = append(cs.Flags, fmt.Sprintf("the suggestion would deny %s of legitimate requests (target: below 0.1%%): see the larger candidates", pct3(cs.Candidates[1].LegitShare)))
		}
		sg.Classes = append(sg.Classes, *cs)
	}
	rep.Suggestion = sg
	return rep, nil
}

func sortedIDs(u *usage) []string {
	ids := slices.Clone(u.order)
	slices.Sort(ids)
	return ids
}

// counted reports whether the rule's limit k counts requests per window.
func counted(r *policy.Rule, k int) bool {
	return !r.Unlimited && k < len(r.Limits) && r.Limits[k].Algorithm != algo.Concurrency
}

// anyCounted reports whether one of the rule's limits counts requests per
// window.
func anyCounted(r *policy.Rule) bool {
	for k := range r.Limits {
		if counted(r, k) {
			return true
		}
	}
	return false
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func distribution(sorted []int64) Distribution {
	if len(sorted) == 0 {
		return Distribution{}
	}
	return Distribution{P50: percentile(sorted, 0.5), P95: percentile(sorted, 0.95), P99: percentile(sorted, 0.99),
		P999: percentile(sorted, 0.999), Max: sorted[len(sorted)-1]}
}

// analyse sets aside the abusive keys of a class and computes the
// distribution and the suggestion; it returns the legitimate keys.
func analyse(cu *classUsage, so SuggestOptions, span time.Duration) (*ClassSuggestion, map[string]bool) {
	r := cu.rule
	cs := &ClassSuggestion{Domain: cu.domain, Rule: r.Path, Limit: cu.limit, Current: "unlimited",
		Window: Duration(time.Duration(cu.window) * time.Second), Keys: len(cu.keys), window: cu.window}
	if !cu.toWrite {
		l := r.Limits[cu.limit]
		cs.Current = describeSpec(l)
		cs.tb, cs.curLimit = l.Algorithm == algo.TokenBucket, int64(l.RequestsPerUnit)
		if len(r.Limits) > 1 {
			cs.Of = len(r.Limits)
		}
	}
	if cs.tb {
		cs.curBurst = cmp.Or(r.Limits[cu.limit].Burst, cs.curLimit)
	}
	keys := make([]string, 0, len(cu.keys))
	for k, ku := range cu.keys {
		keys = append(keys, k)
		cs.Requests += ku.requests
	}
	sort.Strings(keys)
	var abusive []AbusiveKey
	var rest []string
	for _, k := range keys {
		ku := cu.keys[k]
		switch {
		case ku.denied > 0 && 2*ku.denied >= ku.requests:
			abusive = append(abusive, AbusiveKey{Key: k, Requests: ku.requests, Peak: ku.peak(),
				Reason: fmt.Sprintf("current limit denied %d of its %d requests", ku.denied, ku.requests)})
		case len(ku.deniedWin) >= 3:
			abusive = append(abusive, AbusiveKey{Key: k, Requests: ku.requests, Peak: ku.peak(),
				Reason: fmt.Sprintf("current limit denied it in %d windows", len(ku.deniedWin))})
		default:
			rest = append(rest, k)
		}
	}
	peaks := make([]int64, 0, len(rest))
	for _, k := range rest {
		peaks = append(peaks, cu.keys[k].peak())
	}
	slices.Sort(peaks)
	bound := so.Outlier * float64(percentile(peaks, 0.99))
	legit := map[string]bool{}
	var lp, ls []int64
	for _, k := range rest {
		ku := cu.keys[k]
		if p := ku.peak(); len(peaks) > 0 && float64(p) > bound {
			abusive = append(abusive, AbusiveKey{Key: k, Requests: ku.requests, Peak: p,
				Reason: fmt.Sprintf("peak %d is above %g× the p99 (%d) of the other keys", p, so.Outlier, percentile(peaks, 0.99))})
			continue
		}
		legit[k] = true
		lp = append(lp, ku.peak())
		ls = append(ls, ku.peakSecond())
	}
	slices.Sort(lp)
	slices.Sort(ls)
	cs.Legitimate = len(legit)
	cs.Peaks = distribution(lp)
	cs.BurstP99 = percentile(ls, 0.99)
	sort.SliceStable(abusive, func(i, j int) bool {
		if abusive[i].Requests != abusive[j].Requests {
			return abusive[i].Requests > abusive[j].Requests
		}
		return abusive[i].Key < abusive[j].Key
	})
	cs.AbusiveKeys = len(abusive)
	for _, a := range abusive {
		cs.AbusiveRequests += a.Requests
	}
	if len(abusive) > 20 {
		abusive = abusive[:20]
	}
	cs.Abusive = abusive
	switch {
	case cs.Legitimate < so.MinKeys:
		cs.Refused = fmt.Sprintf("only %d legitimate keys (at least %d needed): a p99 of so few keys is one key's habit, not a distribution", cs.Legitimate, so.MinKeys)
		return cs, legit
	case cs.Peaks.P99 == 0:
		cs.Refused = "no usage"
		return cs, legit
	}
	cs.Suggested = int64(math.Ceil(so.Factor * float64(cs.Peaks.P99)))
	cs.Burst = burstFor(cs.Suggested, cs.window, cs.BurstP99, so)
	if cu.toWrite {
		for _, w := range []struct {
			d    time.Duration
			peak func(*keyUsage) map[int64]int64
		}{
			{time.Minute, func(k *keyUsage) map[int64]int64 { return k.perWin }},
			{time.Hour, func(k *keyUsage) map[int64]int64 { return k.perHour }},
			{24 * time.Hour, func(k *keyUsage) map[int64]int64 { return k.perDay }},
		} {
			var ps []int64
			for k := range legit {
				ps = append(ps, maxOf(w.peak(cu.keys[k])))
			}
			slices.Sort(ps)
			d := distribution(ps)
			cs.Windows = append(cs.Windows, WindowSuggestion{Window: Duration(w.d), Peaks: d,
				Suggested: int64(math.Ceil(so.Factor * float64(d.P99)))})
		}
	}
	if span < so.MinSpan {
		cs.Flags = append(cs.Flags, fmt.Sprintf("based on %s of log time (less than %s): daily and weekly peaks may be missing", time.Duration(span), so.MinSpan))
	}
	if cs.Legitimate < so.FewKeys {
		cs.Flags = append(cs.Flags, fmt.Sprintf("based on %d legitimate keys (fewer than %d): the p99 is close to the largest keys", cs.Legitimate, so.FewKeys))
	}
	return cs, legit
}

// burstFor is the token-bucket burst for limit per window seconds:
// BurstShare of the per-minute rate, or the p99 busiest second when larger.
func burstFor(limit, window, p99sec int64, so SuggestOptions) int64 {
	perMinute := float64(limit) * 60 / float64(window)
	return max(int64(math.Ceil(so.BurstShare*perMinute)), p99sec, 1)
}

// candidateLimit is candidate ci's requests_per_unit and burst (0 unless
// the rule is a token bucket); ok is false for "current" (unchanged).
func (cs *ClassSuggestion) candidateLimit(ci int, so SuggestOptions) (limit, burst int64, ok bool) {
	switch ci {
	case 0:
		return cs.curLimit, cs.curBurst, false
	case 1:
		limit = cs.Suggested
	default:
		limit = max(1, int64(math.Ceil(candidateFactors[ci]*float64(cs.Peaks.P99))))
	}
	if cs.tb {
		burst = burstFor(limit, cs.window, cs.BurstP99, so)
	}
	return limit, burst, true
}

// score counts what the candidate replay's usage of one class denied.
func score(name string, limit, burst int64, cu *classUsage, legit map[string]bool) Candidate {
	c := Candidate{Name: name, Limit: limit, Burst: burst}
	if cu == nil {
		return c
	}
	var legitReq, abusiveReq int
	for k, ku := range cu.keys {
		c.Denied += ku.denied
		if legit[k] {
			legitReq += ku.requests
			c.LegitDenied += ku.denied
			if ku.denied > 0 {
				c.LegitKeysDenied++
			}
		} else {
			abusiveReq += ku.requests
			c.AbusiveDenied += ku.denied
		}
	}
	c.LegitShare = ratio(c.LegitDenied, legitReq)
	c.LegitKeyShare = ratio(c.LegitKeysDenied, len(legit))
	c.AbusiveShare = ratio(c.AbusiveDenied, abusiveReq)
	return c
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// replayCandidate replays lines with the config srcs in global shadow mode
// on a new store (SuggestOptions.NewStore) and returns the usage.
func replayCandidate(ctx context.Context, lines []LogLine, opts Options, so SuggestOptions, srcs []rewritten) (*usage, error) {
	ps := make([]policy.Source, len(srcs))
	for i, s := range srcs {
		ps[i] = s.Source
	}
	set, _, err := policy.LoadSources(so.Load, ps...)
	if err != nil {
		return nil, err
	}
	clock := &Clock{}
	st, closeStore, err := so.NewStore(clock.Now)
	if err != nil {
		return nil, err
	}
	defer closeStore()
	o := opts
	o.Policy, o.Store, o.Clock, o.ShadowMode, o.Speed = set, st, clock, true, 0
	use := newUsage()
	if _, err := runLines(ctx, lines, nil, o, use); err != nil {
		return nil, err
	}
	return use, nil
}
