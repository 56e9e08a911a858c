package replay

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// pct3 renders a share with three decimals ("0.100%"): the false-positive
// target is 0.1 %.
func pct3(f float64) string { return fmt.Sprintf("%.3f%%", 100*f) }

// WriteText writes the suggestion: per rule the distribution, the
// suggested limit and burst, the keys set aside, the candidates, then the
// config fragments.
func (s *Suggestion) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("\nsuggested limits: %s of log time, limit = %g × p99 of the legitimate keys' peak per window\n", time.Duration(s.Span), s.Factor)
	p("abusive keys: %s\n", s.AbuseRule)
	for _, c := range s.Classes {
		of := ""
		if c.Of > 0 {
			of = fmt.Sprintf(", limit %d of %d", c.Limit+1, c.Of)
		}
		p("\nrule %s (%s; window %s%s)\n", c.Rule, c.Current, time.Duration(c.Window), of)
		p("  keys:\t%d (legitimate %d, set aside %d with %d requests); requests %d\n", c.Keys, c.Legitimate, c.AbusiveKeys, c.AbusiveRequests, c.Requests)
		d := c.Peaks
		p("  peak per window:\tp50 %d  p95 %d  p99 %d  p99.9 %d  max %d\n", d.P50, d.P95, d.P99, d.P999, d.Max)
		if c.Refused != "" {
			p("  no suggestion:\t%s\n", c.Refused)
		} else {
			p("  suggested:\t%d per %s (%g × p99 %d); as a token_bucket, burst %d (p99 busiest second %d)\n",
				c.Suggested, time.Duration(c.Window), s.Factor, d.P99, c.Burst, c.BurstP99)
		}
		for _, w := range c.Windows {
			d := w.Peaks
			p("  per %s:\tp50 %d  p95 %d  p99 %d  p99.9 %d  max %d; suggested %d\n", time.Duration(w.Window), d.P50, d.P95, d.P99, d.P999, d.Max, w.Suggested)
		}
		if len(c.Windows) > 0 && c.Refused == "" {
			p("  (unlimited):\tno candidates; write the rule with one of these limits, then run --suggest again\n")
		}
		for _, f := range c.Flags {
			p("  caution:\t%s\n", f)
		}
		for _, a := range c.Abusive {
			p("  set aside:\t%s: %d requests, peak %d: %s\n", a.Key, a.Requests, a.Peak, a.Reason)
		}
		if len(c.Candidates) > 0 {
			p("  candidate\tlimit\tlegit requests denied\tlegit keys denied\tabusive stopped\tdenied (all keys)\n")
			for _, k := range c.Candidates {
				lim := fmt.Sprint(k.Limit)
				if k.Burst > 0 {
					lim += fmt.Sprintf(" burst %d", k.Burst)
				}
				p("  %s\t%s\t%d (%s)\t%d (%s)\t%d (%s)\t%d\n", k.Name, lim, k.LegitDenied, pct3(k.LegitShare),
					k.LegitKeysDenied, pct3(k.LegitKeyShare), k.AbusiveDenied, pct3(k.AbusiveShare), k.Denied)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, f := range s.Fragments {
		fmt.Fprintf(w, "\n# %s with the suggested limits, every rule in shadow mode:\n%s", f.File, f.YAML)
		if !strings.HasSuffix(f.YAML, "\n") {
			fmt.Fprintln(w)
		}
	}
	return nil
}
