package policy

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// WriteExplain writes one line per rule, in config order:
//
//	<path>: <limit>[; <limit>…] [shadow_mode] [quota_mode] [counting=<policy>] [detailed_metric] [replaces=a,b] [override=<mode> [override_max=<n>/<unit>]] (file:line)
//
// where <limit> is `<algorithm> <requests_per_unit>/<unit>[×<multiplier>]
// [burst=<n>] [calendar] [store=durable] failure_mode=<mode> policy="<policy>"` or
// `unlimited`; override= appears when the rule or its domain sets
// `override:` (the effective mode and cap). Used by /rlconfig and
// `ratelimitd validate --explain`.
func (s *Set) WriteExplain(w io.Writer) error {
	if s == nil {
		return nil
	}
	var b strings.Builder
	for _, r := range s.rules {
		b.Reset()
		b.WriteString(explainPath(r.Path))
		b.WriteString(": ")
		if r.Unlimited {
			b.WriteString("unlimited")
			if r.Name != "" {
				fmt.Fprintf(&b, " name=%q", r.Name)
			}
		}
		for i, l := range r.Limits {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s %d/%s", AlgorithmName(l.Algorithm), l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
			if l.UnitMultiplier != 1 {
				fmt.Fprintf(&b, "×%d", l.UnitMultiplier)
			}
			if l.Algorithm == algo.TokenBucket {
				burst := l.Burst
				if burst == 0 {
					burst = int64(l.RequestsPerUnit)
				}
				fmt.Fprintf(&b, " burst=%d", burst)
			}
			if l.Calendar {
				b.WriteString(" calendar")
			}
			if l.Store == StoreDurable {
				b.WriteString(" store=durable")
			}
			fmt.Fprintf(&b, " failure_mode=%s policy=%q", l.FailureMode, l.Policy)
			if l.Consistency == Leased {
				b.WriteString(" consistency=leased")
			}
			if l.Name != "" {
				fmt.Fprintf(&b, " name=%q", l.Name)
			}
		}
		if r.ShadowMode {
			b.WriteString(" shadow_mode")
		}
		if r.QuotaMode {
			b.WriteString(" quota_mode")
		}
		if r.Counting != CountingDefault {
			fmt.Fprintf(&b, " counting=%s", r.Counting)
		}
		if r.DetailedMetric {
			b.WriteString(" detailed_metric")
		}
		if len(r.Replaces) > 0 {
			fmt.Fprintf(&b, " replaces=%s", strings.Join(r.Replaces, ","))
		}
		for _, n := range r.nodes {
			if n.ipv6Prefix > 0 {
				fmt.Fprintf(&b, " ipv6_prefix(%s)=%d", n.key, n.ipv6Prefix)
			}
		}
		if c := r.CGNAT; c != nil {
			rs := make([]string, len(c.Ranges))
			for i, p := range c.Ranges {
				rs[i] = p.String()
			}
			fmt.Fprintf(&b, " cgnat=x%d[%s]", c.Multiplier, strings.Join(rs, ","))
		}
		if rv := r.Reserve; rv != nil {
			fmt.Fprintf(&b, " reserve=%s:%s/%g", rv.Entry, rv.Value, rv.Share)
			if rv.SaturatedShare > 0 {
				fmt.Fprintf(&b, " saturated_share=%g", rv.SaturatedShare)
			}
		}
		if pn := r.Penalty; pn.After > 0 {
			fmt.Fprintf(&b, " penalty=%d/%s:block=%s", pn.After, pn.Within, pn.Block)
			if pn.Extend {
				b.WriteString(",extend")
			}
		}
		if pol, set := s.ruleOverride(r); set {
			fmt.Fprintf(&b, " override=%s", pol.mode)
			if pol.maxSet {
				fmt.Fprintf(&b, " override_max=%d/%s", pol.maxRPU, strings.ToLower(pol.maxUnit.String()))
			}
		}
		fmt.Fprintf(&b, " (%s)\n", formatPos(r.File, r.Line))
		if _, err := io.WriteString(w, b.String()); err != nil {
			return fmt.Errorf("policy: explain: %w", err)
		}
	}
	return nil
}

// ruleOverride is the override policy of r, and whether r or its domain
// sets one (explain shows nothing for the defaults).
func (s *Set) ruleOverride(r *Rule) (overridePolicy, bool) {
	d := s.domains[r.Domain]
	set := d != nil && d.override != nil
	if len(r.nodes) > 0 && r.nodes[len(r.nodes)-1].override != nil {
		set = true
	}
	return effectiveOverride(d, r), set
}

// explainPath keeps one rule per line: a path with control characters is
// shown Go-quoted.
func explainPath(p string) string {
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return strconv.Quote(p)
		}
	}
	return p
}
