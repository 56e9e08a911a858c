package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a replay. Request counts add up:
// Requests = Allowed + Denied + ShadowDenied + NotChecked. For every rule,
// Allowed + Denied + Shadow is the number of request descriptors it
// answered; over all rules plus Unmatched it is Descriptors.
type Report struct {
	// Domain is the rate-limit filter's domain (Envoy.Domain); routes
	// may send under another (RateLimitPerRoute.domain).
	Domain string `json:"domain"`
	// Order is the replay order, "time" or "file" (Options.Order).
	Order string `json:"order"`
	// ShadowMode is Options.ShadowMode, the global shadow mode.
	ShadowMode bool `json:"shadow_mode"`
	// Lines is the number of non-blank log lines; Malformed of them did
	// not parse (MalformedLines lists the first ones with line numbers).
	Lines int `json:"lines"`
	// Malformed is the number of lines that did not parse.
	Malformed int `json:"malformed"`
	// MalformedLines are the first Options.MaxMalformedListed malformed
	// lines, in file order.
	MalformedLines []Malformed `json:"malformed_lines,omitempty"`
	// First is the simulated instant of the earliest replayed request.
	First time.Time `json:"first"`
	// Last is the simulated instant of the latest replayed request.
	Last time.Time `json:"last"`

	// Requests is the number of replayed requests (parsed lines).
	Requests int `json:"requests"`
	// Allowed: the service answered OK and no shadow rule was over.
	Allowed int `json:"allowed"`
	// Denied: overall OVER_LIMIT (Envoy would answer 429).
	Denied int `json:"denied"`
	// ShadowDenied: allowed only because a rule (or the service) is in
	// shadow mode; would be denied once enforced.
	ShadowDenied int `json:"shadow_denied"`
	// NotChecked: no descriptor was sent (no route matched, NoRoute of
	// them, or every rate_limit's actions yielded nothing).
	NotChecked int `json:"not_checked"`
	// NoRoute counts the NotChecked requests that no route matched
	// (Envoy answers them 404).
	NoRoute int `json:"no_route"`
	// DeniedShare = Denied / Requests (0 with no requests).
	DeniedShare float64 `json:"denied_share"`
	// ShadowShare = ShadowDenied / Requests (0 with no requests).
	ShadowShare float64 `json:"shadow_share"`

	// Descriptors sent (enforced ones, not apply_on_stream_done).
	Descriptors int `json:"descriptors"`
	// Unmatched descriptors matched no rule (sent for nothing); their
	// key shapes are in UnmatchedShapes (Denied holds the count).
	Unmatched int `json:"unmatched"`
	// UnmatchedShapes are the entry key lists ("k1,k2") of the unmatched
	// descriptors, most frequent first; TopEntry.Denied holds the count.
	UnmatchedShapes []TopEntry `json:"unmatched_shapes,omitempty"`
	// Rules are the rules that answered at least one descriptor, ordered
	// by domain, then path.
	Rules []RuleStats `json:"rules"`
	// StreamDoneCalls counts apply_on_stream_done calls (lease releases).
	StreamDoneCalls int `json:"stream_done_calls"`

	// TopDeniedClients are the clients (addresses) with the most denied
	// plus shadow-denied requests, at most Options.Top, most first (ties
	// by key).
	TopDeniedClients []TopEntry `json:"top_denied_clients"`
	// TopDeniedPaths is TopDeniedClients for request paths (query cut).
	TopDeniedPaths []TopEntry `json:"top_denied_paths"`
	// Minutes holds one entry per minute of log time that had requests.
	Minutes []Minute `json:"minutes"`
	// Suggestion is the outcome of replay --suggest (Suggest); nil for a
	// plain replay.
	Suggestion *Suggestion `json:"suggestion,omitempty"`
}

// RuleStats counts the request descriptors one rule answered.
type RuleStats struct {
	// Domain is the domain the rule's descriptors were sent under.
	Domain string `json:"domain"`
	// Path is the rule's stat key (policy.Rule.Path).
	Path string `json:"path"`
	// Name is the first limit's policy name.
	Name string `json:"name,omitempty"`
	// Limits describe the rule's limits in config order ("name: 10/minute
	// sliding_window", "5 concurrent").
	Limits []string `json:"limits,omitempty"`
	// ShadowMode is the rule's shadow_mode (policy.Rule.ShadowMode).
	ShadowMode bool `json:"shadow_mode,omitempty"`
	// Unlimited is the rule's unlimited: true (policy.Rule.Unlimited).
	Unlimited bool `json:"unlimited,omitempty"`
	// Allowed: the descriptor passed (or its request was denied by
	// another descriptor: nothing was consumed, status OK).
	Allowed int `json:"allowed"`
	// Denied: this descriptor's status was OVER_LIMIT in a denied request.
	Denied int `json:"denied"`
	// Shadow: over the limit but not enforced (shadow_mode rule or global
	// shadow mode).
	Shadow int `json:"shadow"`
}

// TopEntry is a client, path or descriptor shape with its counts.
type TopEntry struct {
	// Key is the client address, the path, or the entry key list.
	Key string `json:"key"`
	// Denied is the number of denied requests (for an unmatched shape,
	// the number of descriptors).
	Denied int `json:"denied"`
	// Shadow is the number of requests allowed only by shadow mode.
	Shadow int `json:"shadow,omitempty"`
}

// Minute summarises one minute of log time.
type Minute struct {
	// Start is the minute's first instant (UTC, a whole minute).
	Start time.Time `json:"start"`
	// Requests is the number of requests in the minute.
	Requests int `json:"requests"`
	// Denied counts them as Report.Denied does.
	Denied int `json:"denied"`
	// Shadow counts them as Report.ShadowDenied does.
	Shadow int `json:"shadow"`
	// Busiest are the clients with the most requests in the minute (at
	// most 3, or Options.Top when smaller; ties by address).
	Busiest []ClientMinute `json:"busiest"`
}

// ClientMinute is one client's traffic within a minute against its limits.
type ClientMinute struct {
	// Client is the client address.
	Client string `json:"client"`
	// Requests is the client's number of requests in the minute.
	Requests int `json:"requests"`
	// Denied counts them as Report.Denied does.
	Denied int `json:"denied"`
	// Shadow counts them as Report.ShadowDenied does.
	Shadow int `json:"shadow"`
	// MinRemaining is the limit_remaining of the client's tightest limit
	// in the minute: the lowest limit_remaining relative to the limit's
	// requests_per_unit (-1: no counted limit). Limit names that limit
	// ("policy rate/unit").
	MinRemaining int64 `json:"min_remaining"`
	// Limit names the limit of MinRemaining ("policy 10/minute"; "" with
	// no counted limit).
	Limit string `json:"limit,omitempty"`

	ratio float64 // MinRemaining / requests_per_unit of Limit
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func pct(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }

// WriteText writes a human-readable summary. Minutes are listed only when
// something was denied or shadowed in them, plus the busiest overall (at
// most 20 lines).
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("replay of domain %q (order: %s, shadow mode: %v)\n", r.Domain, r.Order, r.ShadowMode)
	p("log:\t%d lines, %d malformed, %s .. %s\n", r.Lines, r.Malformed, r.First.Format(time.RFC3339), r.Last.Format(time.RFC3339))
	if len(r.MalformedLines) > 0 {
		var ns []string
		for i, m := range r.MalformedLines {
			if i == 20 {
				ns = append(ns, "...")
				break
			}
			ns = append(ns, fmt.Sprint(m.Line))
		}
		p("malformed lines:\t%s\n", strings.Join(ns, ", "))
	}
	p("requests:\t%d\n", r.Requests)
	p("  allowed:\t%d\n", r.Allowed)
	p("  denied (429):\t%d\t%s\n", r.Denied, pct(r.DeniedShare))
	p("  shadow (would be denied):\t%d\t%s\n", r.ShadowDenied, pct(r.ShadowShare))
	p("  not checked:\t%d\t(no route: %d)\n", r.NotChecked, r.NoRoute)
	p("descriptors:\t%d\t(unmatched: %d)\n", r.Descriptors, r.Unmatched)
	if r.StreamDoneCalls > 0 {
		p("stream-done calls:\t%d\n", r.StreamDoneCalls)
	}
	p("\nrule\tallowed\tdenied\tshadow\tlimits\n")
	for _, rs := range r.Rules {
		lim := strings.Join(rs.Limits, "; ")
		if rs.Unlimited {
			lim = "unlimited"
		}
		if rs.ShadowMode {
			lim += " (shadow_mode)"
		}
		p("%s\t%d\t%d\t%d\t%s\n", rs.Path, rs.Allowed, rs.Denied, rs.Shadow, lim)
	}
	for _, s := range r.UnmatchedShapes {
		p("(no rule) %s\t%d\t\t\t\n", s.Key, s.Denied)
	}
	writeTop := func(title string, es []TopEntry) {
		p("\n%s\tdenied\tshadow\n", title)
		if len(es) == 0 {
			p("(none)\t\t\n")
		}
		for _, e := range es {
			p("%s\t%d\t%d\n", e.Key, e.Denied, e.Shadow)
		}
	}
	writeTop("top denied clients", r.TopDeniedClients)
	writeTop("top denied paths", r.TopDeniedPaths)
	p("\nminute (UTC)\tbusiest clients: requests (denied/shadow) [tightest limit, min remaining]\n")
	shown := 0
	for _, m := range r.hotMinutes(20) {
		var cs []string
		for _, c := range m.Busiest {
			s := fmt.Sprintf("%s: %d (%d/%d)", c.Client, c.Requests, c.Denied, c.Shadow)
			if c.MinRemaining >= 0 {
				s += fmt.Sprintf(" [%s, %d left]", c.Limit, c.MinRemaining)
			}
			cs = append(cs, s)
		}
		p("%s\t%s\n", m.Start.Format("2006-01-02 15:04"), strings.Join(cs, "; "))
		shown++
	}
	if shown == 0 {
		p("(none)\t\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Suggestion != nil {
		return r.Suggestion.WriteText(w)
	}
	return nil
}

// hotMinutes returns up to n minutes, in time order: those with denials or
// shadow denials first, then those whose busiest client sent the most.
func (r *Report) hotMinutes(n int) []Minute {
	idx := make([]int, len(r.Minutes))
	for i := range idx {
		idx[i] = i
	}
	score := func(m Minute) int {
		s := m.Denied + m.Shadow
		b := 0
		if len(m.Busiest) > 0 {
			b = m.Busiest[0].Requests
		}
		return s*1_000_000 + b
	}
	sortIdx(idx, func(a, b int) bool { return score(r.Minutes[a]) > score(r.Minutes[b]) })
	if len(idx) > n {
		idx = idx[:n]
	}
	sortIdx(idx, func(a, b int) bool { return a < b })
	out := make([]Minute, len(idx))
	for i, k := range idx {
		out[i] = r.Minutes[k]
	}
	return out
}

func sortIdx(idx []int, less func(a, b int) bool) {
	sort.SliceStable(idx, func(i, j int) bool { return less(idx[i], idx[j]) })
}
