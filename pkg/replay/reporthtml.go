package replay

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// plotBucket is one bar of the HTML plot.
type plotBucket struct {
	X, W                         float64
	YAllowed, HAllowed           float64
	YShadow, HShadow             float64
	YDenied, HDenied             float64
	Title                        string
	BusiestY                     float64
	Requests, Denied, Shadow, Bz int
}

// WriteHTML writes one self-contained HTML page (no scripts, no external
// resources): the totals, an inline SVG plot of requests per minute over
// log time (allowed, shadow, denied stacked; the busiest client's requests
// per minute as a line), the rules table and the top lists.
func (r *Report) WriteHTML(w io.Writer) error {
	const width, height, left, bottom, top = 960.0, 300.0, 50.0, 30.0, 10.0
	plotW, plotH := width-left-10, height-bottom-top
	// Aggregate minutes into at most 480 buckets of a round duration over
	// [First, Last]. Bars are request counts per bucket.
	var buckets []plotBucket
	per := plotPeriod(r.First, r.Last)
	origin := r.First.Truncate(per)
	accs := r.plotAccs(origin, per)
	nb := len(accs)
	maxY := 1
	for _, a := range accs {
		maxY = max(maxY, a.req, a.busiest)
	}
	bw := plotW / float64(nb)
	y := func(v float64) float64 { return top + plotH - v/float64(maxY)*plotH }
	// visible keeps a non-empty segment at least 2px tall.
	visible := func(h float64, n int) float64 {
		if n > 0 && h < 2 {
			return 2
		}
		return h
	}
	var line []string
	for i, a := range accs {
		allowed := float64(a.req - a.den - a.sh)
		sh, den := float64(a.sh), float64(a.den)
		b := plotBucket{X: left + float64(i)*bw, W: math.Max(bw-0.5, 0.5), Requests: a.req, Denied: a.den, Shadow: a.sh, Bz: a.busiest}
		b.HAllowed = top + plotH - y(allowed)
		b.YAllowed = top + plotH - b.HAllowed
		b.HShadow = visible(y(allowed)-y(allowed+sh), a.sh)
		b.YShadow = b.YAllowed - b.HShadow
		b.HDenied = visible(y(allowed+sh)-y(allowed+sh+den), a.den)
		b.YDenied = b.YShadow - b.HDenied
		t0 := origin.Add(time.Duration(i) * per)
		b.Title = fmt.Sprintf("%s +%s: %d requests, %d denied, %d shadow; busiest client %d in one minute", t0.Format("Jan 2 15:04"), per, a.req, a.den, a.sh, a.busiest)
		b.BusiestY = y(float64(a.busiest))
		if a.busiest > 0 {
			line = append(line, fmt.Sprintf(`<circle cx="%.1f" cy="%.1f" r="2.5" fill="#1565c0"/>`, b.X+b.W/2, b.BusiestY))
		}
		buckets = append(buckets, b)
	}
	span := r.Last.Sub(r.First)
	var ticks []map[string]any
	for i := 0; i <= 4; i++ {
		v := float64(maxY) * float64(i) / 4
		ticks = append(ticks, map[string]any{"Y": y(v), "Label": fmt.Sprintf("%.0f", v)})
	}
	var xticks []map[string]any
	if nb > 0 && len(r.Minutes) > 0 {
		for i := 0; i <= 4; i++ {
			t := r.First.Add(time.Duration(float64(span) * float64(i) / 4))
			anchor := map[int]string{0: "start", 4: "end"}[i]
			if anchor == "" {
				anchor = "middle"
			}
			xticks = append(xticks, map[string]any{"X": left + plotW*float64(i)/4, "Label": t.Format("Jan 2 15:04"), "Anchor": anchor})
		}
	}
	data := map[string]any{
		"R": r, "Buckets": buckets, "Line": template.HTML(strings.Join(line, "")), "Ticks": ticks, "XTicks": xticks,
		"W": width, "H": height, "Left": left, "PlotW": plotW, "Base": top + plotH, "Per": strings.TrimSuffix(strings.TrimSuffix(per.String(), "0s"), "0m"),
		"Hot": r.hotMinutes(20), "DeniedPct": pct(r.DeniedShare), "ShadowPct": pct(r.ShadowShare),
	}
	return htmlPage.Execute(w, data)
}

// plotPeriods are the bucket durations of the plot, shortest first.
var plotPeriods = []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
	30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

// plotPeriod is the shortest of plotPeriods that covers [first, last] in
// fewer than 480 buckets (the longest when none does).
func plotPeriod(first, last time.Time) time.Duration {
	per := time.Minute
	for _, d := range plotPeriods {
		per = d
		if last.Sub(first.Truncate(d))/d < 480 {
			break
		}
	}
	return per
}

// plotAcc is the counts of one plot bucket: requests, denied, shadow, and
// the busiest client's requests in one minute.
type plotAcc struct{ req, den, sh, busiest int }

// plotAccs sums r.Minutes into buckets of per from origin up to r.Last
// (one bucket when there are no minutes).
func (r *Report) plotAccs(origin time.Time, per time.Duration) []plotAcc {
	nb := int(r.Last.Sub(origin)/per) + 1
	if len(r.Minutes) == 0 {
		nb = 1
	}
	accs := make([]plotAcc, nb)
	for _, m := range r.Minutes {
		i := min(max(int(m.Start.Sub(origin)/per), 0), nb-1)
		a := &accs[i]
		a.req += m.Requests
		a.den += m.Denied
		a.sh += m.Shadow
		if len(m.Busiest) > 0 && m.Busiest[0].Requests > a.busiest {
			a.busiest = m.Busiest[0].Requests
		}
	}
	return accs
}

var htmlPage = template.Must(template.New("page").Funcs(template.FuncMap{"pct3": pct3, "inc": func(i int) int { return i + 1 }}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>ratelimitd replay: {{.R.Domain}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1000px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}.big{font-size:28px;font-weight:600}
.k{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
</style></head><body>
<h1>Replay of domain “{{.R.Domain}}”</h1>
<p>{{.R.Requests}} requests from {{.R.First.Format "2006-01-02 15:04:05"}} to {{.R.Last.Format "2006-01-02 15:04:05"}} UTC
({{.R.Malformed}} malformed lines, order: {{.R.Order}}{{if .R.ShadowMode}}, global shadow mode{{end}}).</p>
<p><span class="big" style="color:#c62828">{{.DeniedPct}}</span> would be denied ({{.R.Denied}}),
<span class="big" style="color:#ef6c00">{{.ShadowPct}}</span> only pass because of shadow mode ({{.R.ShadowDenied}}),
{{.R.Allowed}} allowed, {{.R.NotChecked}} not checked.</p>
<h2>Requests over time</h2>
<p><span class="k" style="background:#90a4ae"></span>allowed<span class="k" style="background:#ef6c00"></span>shadow (would be denied)<span class="k" style="background:#c62828"></span>denied<span class="k" style="background:#1565c0;border-radius:6px"></span>busiest client's requests in one minute (bars: requests per {{.Per}})</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-label="requests over time">
{{range .Ticks}}<line x1="{{$.Left}}" x2="{{$.W}}" y1="{{printf "%.1f" .Y}}" y2="{{printf "%.1f" .Y}}" stroke="#eee"/><text x="{{$.Left}}" dx="-4" y="{{printf "%.1f" .Y}}" dy="4" text-anchor="end" font-size="11">{{.Label}}</text>
{{end}}{{range .XTicks}}<text x="{{printf "%.1f" .X}}" y="{{$.H}}" dy="-8" text-anchor="{{.Anchor}}" font-size="11">{{.Label}}</text>
{{end}}{{range .Buckets}}<g><title>{{.Title}}</title><rect x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .YAllowed}}" width="{{printf "%.2f" .W}}" height="{{printf "%.1f" .HAllowed}}" fill="#90a4ae"/>{{if .Shadow}}<rect x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .YShadow}}" width="{{printf "%.2f" .W}}" height="{{printf "%.1f" .HShadow}}" fill="#ef6c00"/>{{end}}{{if .Denied}}<rect x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .YDenied}}" width="{{printf "%.2f" .W}}" height="{{printf "%.1f" .HDenied}}" fill="#c62828"/>{{end}}</g>
{{end}}{{.Line}}
<line x1="{{.Left}}" x2="{{.W}}" y1="{{.Base}}" y2="{{.Base}}" stroke="#444"/>
</svg>
<h2>Rules</h2>
<table><tr><th>rule</th><th>allowed</th><th>denied</th><th>shadow</th><th style="text-align:left">limits</th></tr>
{{range .R.Rules}}<tr><td>{{.Path}}</td><td>{{.Allowed}}</td><td>{{.Denied}}</td><td>{{.Shadow}}</td><td style="text-align:left">{{if .Unlimited}}unlimited{{else}}{{range $i, $l := .Limits}}{{if $i}}; {{end}}{{$l}}{{end}}{{end}}{{if .ShadowMode}} (shadow_mode){{end}}</td></tr>
{{end}}{{range .R.UnmatchedShapes}}<tr><td>(no rule) {{.Key}}</td><td colspan="4" style="text-align:left">{{.Denied}} descriptors matched no rule</td></tr>
{{end}}</table>
<h2>Top denied clients</h2>
<table><tr><th>client</th><th>denied</th><th>shadow</th></tr>{{range .R.TopDeniedClients}}<tr><td>{{.Key}}</td><td>{{.Denied}}</td><td>{{.Shadow}}</td></tr>{{else}}<tr><td colspan="3">none</td></tr>{{end}}</table>
<h2>Top denied paths</h2>
<table><tr><th>path</th><th>denied</th><th>shadow</th></tr>{{range .R.TopDeniedPaths}}<tr><td>{{.Key}}</td><td>{{.Denied}}</td><td>{{.Shadow}}</td></tr>{{else}}<tr><td colspan="3">none</td></tr>{{end}}</table>
<h2>Busiest minutes</h2>
<table><tr><th>minute (UTC)</th><th style="text-align:left">busiest clients: requests (denied/shadow) [tightest limit, min remaining]</th></tr>
{{range .Hot}}<tr><td>{{.Start.Format "2006-01-02 15:04"}}</td><td style="text-align:left">{{range $i, $c := .Busiest}}{{if $i}}; {{end}}{{$c.Client}}: {{$c.Requests}} ({{$c.Denied}}/{{$c.Shadow}}){{if ge $c.MinRemaining 0}} [{{$c.Limit}}, {{$c.MinRemaining}} left]{{end}}{{end}}</td></tr>
{{end}}</table>
{{with .R.Suggestion}}<h2>Suggested limits</h2>
<p>{{.Span}} of log time; suggested limit = {{.Factor}} × the p99 of the legitimate keys' peak per window. Abusive keys: {{.AbuseRule}}.</p>
{{range .Classes}}<h3>{{.Rule}}{{if .Of}} (limit {{inc .Limit}} of {{.Of}}){{end}}</h3>
<p>Current: {{.Current}} (window {{.Window}}). {{.Keys}} keys ({{.Legitimate}} legitimate, {{.AbusiveKeys}} set aside with {{.AbusiveRequests}} requests), {{.Requests}} requests.<br>
Peak per window: p50 {{.Peaks.P50}}, p95 {{.Peaks.P95}}, p99 {{.Peaks.P99}}, p99.9 {{.Peaks.P999}}, max {{.Peaks.Max}}.<br>
{{if .Refused}}<b>No suggestion:</b> {{.Refused}}{{else}}<b>Suggested: {{.Suggested}} per {{.Window}}</b>; as a token_bucket, burst {{.Burst}} (p99 busiest second {{.BurstP99}}).{{end}}</p>
{{if .Windows}}<table><tr><th>window</th><th>p50</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th><th>suggested</th></tr>{{range .Windows}}<tr><td>{{.Window}}</td><td>{{.Peaks.P50}}</td><td>{{.Peaks.P95}}</td><td>{{.Peaks.P99}}</td><td>{{.Peaks.P999}}</td><td>{{.Peaks.Max}}</td><td>{{.Suggested}}</td></tr>{{end}}</table>{{end}}
{{range .Flags}}<p style="color:#ef6c00">Caution: {{.}}</p>{{end}}
{{if .Abusive}}<table><tr><th>set aside</th><th>requests</th><th>peak</th><th style="text-align:left">why</th></tr>{{range .Abusive}}<tr><td>{{.Key}}</td><td>{{.Requests}}</td><td>{{.Peak}}</td><td style="text-align:left">{{.Reason}}</td></tr>{{end}}</table>{{end}}
{{if .Candidates}}<table><tr><th>candidate</th><th>limit</th><th>legit requests denied</th><th>legit keys denied</th><th>abusive stopped</th><th>denied (all keys)</th></tr>
{{range .Candidates}}<tr><td>{{.Name}}</td><td>{{.Limit}}{{if .Burst}} burst {{.Burst}}{{end}}</td><td>{{.LegitDenied}} ({{pct3 .LegitShare}})</td><td>{{.LegitKeysDenied}} ({{pct3 .LegitKeyShare}})</td><td>{{.AbusiveDenied}} ({{pct3 .AbusiveShare}})</td><td>{{.Denied}}</td></tr>
{{end}}</table>{{end}}{{end}}
{{range .Notes}}<p>Note: {{.}}</p>{{end}}
{{range .Fragments}}<h3>{{.File}} with the suggested limits, every rule in shadow mode</h3><pre>{{.YAML}}</pre>{{end}}
{{end}}{{if .R.MalformedLines}}<h2>Malformed lines</h2><p>{{range $i, $m := .R.MalformedLines}}{{if $i}}, {{end}}{{$m.Line}}{{end}}</p>{{end}}
</body></html>
`))
