// Package deploy_test checks the Prometheus alerting rules and the Grafana
// dashboard: every PromQL expression parses, each file exists once (in the
// Helm chart's files/), every metric and label they name is in queried, and
// every family in queried appears on a running ratelimitd's /metrics.
package deploy_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// family is one ratelimitd metric family the rules or the dashboard query.
type family struct {
	Name   string
	Type   string   // counter, gauge, histogram (as /metrics declares it)
	Labels []string // ratelimitd's own labels (not le, not target labels)
	// Values lists the allowed values of enumerated labels.
	Values map[string][]string
}

// The one copy of the alerting rules and of the dashboard.
const (
	rulesFile     = "helm/ratelimitd/files/alerts.rules.yaml"
	dashboardFile = "helm/ratelimitd/files/ratelimitd-dashboard.json"
)

// queried is the single list of metric families that the rules and the
// dashboard use. The rules tests fail when a query names a family or label
// not listed here; TestMetricsExistInRunningService fails when a family
// listed here is not on /metrics with exactly these labels.
var queried = []family{
	{Name: "ratelimitd_requests_total", Type: "counter", Labels: []string{"domain", "code"},
		Values: map[string][]string{"code": {"ok", "over_limit", "invalid_argument", "unavailable", "deadline_exceeded"}}},
	{Name: "ratelimitd_decisions_total", Type: "counter", Labels: []string{"domain", "rule", "result"},
		Values: map[string][]string{"result": {"ok", "over_limit", "near_limit", "shadow", "failed_open", "failed_closed"}}},
	{Name: "ratelimitd_early_warning_total", Type: "counter", Labels: []string{"domain", "rule"}},
	{Name: "ratelimitd_request_duration_seconds", Type: "histogram"},
	{Name: "ratelimitd_backend_duration_seconds", Type: "histogram", Labels: []string{"store"}},
	{Name: "ratelimitd_backend_errors_total", Type: "counter", Labels: []string{"cause"}},
	{Name: "ratelimitd_config_reloads_total", Type: "counter", Labels: []string{"result"},
		Values: map[string][]string{"result": {"success", "unchanged", "failure", "read_error", "watch_error"}}},
	{Name: "ratelimitd_config_info", Type: "gauge", Labels: []string{"hash"}},
	{Name: "ratelimitd_inflight_requests", Type: "gauge"},
	{Name: "ratelimitd_backend_circuit_state", Type: "gauge", Labels: []string{"state"},
		Values: map[string][]string{"state": {"closed", "open", "half_open"}}},
}

// targetLabels are attached by Prometheus' scrape config (Kubernetes
// service discovery or the Prometheus Operator), not by ratelimitd.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

func lookup(series string) (family, bool) {
	for _, f := range queried {
		if series == f.Name {
			return f, true
		}
		if f.Type == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if series == f.Name+s {
					return f, true
				}
			}
		}
	}
	return family{}, false
}

// ruleFile is the Prometheus rule file format (and PrometheusRule spec).
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func readStrict(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	var plain ruleFile
	readStrict(t, rulesFile, &plain)
	return plain
}

var promql = parser.NewParser(parser.Options{})

// query is one PromQL expression with where it came from.
type query struct {
	where string
	expr  parser.Expr
}

func parseQuery(t *testing.T, where, s string) (query, bool) {
	t.Helper()
	e, err := promql.ParseExpr(s)
	if err != nil {
		t.Errorf("%s: PromQL does not parse: %v\n%s", where, err, s)
		return query{}, false
	}
	return query{where, e}, true
}

func ruleQueries(t *testing.T) []query {
	plain := loadRules(t)
	var out []query
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			if q, ok := parseQuery(t, "alert "+r.Alert, r.Expr); ok {
				out = append(out, q)
			}
		}
	}
	return out
}

// Grafana variables, replaced by values of the same PromQL type.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h",
	"${datasource}", "x", "$namespace", ".*", "$domain", ".*",
)

var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// dashboardQueries returns every target expression and every variable
// query (label_values(selector, label) as the selector plus the label).
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Definition string          `json:"definition"`
				Query      json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var out []query
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource must be the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if q, ok := parseQuery(t, "panel "+p.Title, grafanaVars.Replace(tg.Expr)); ok {
				out = append(out, q)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesRE.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: want label_values(selector, label), got %q", v.Name, v.Definition)
			continue
		}
		if q, ok := parseQuery(t, "variable "+v.Name, grafanaVars.Replace(m[1])); ok {
			out = append(out, q)
			for _, p := range checkLabel(q.where, selectorFamilies(q.expr), m[2]) {
				t.Error(p)
			}
		}
	}
	if len(out) < 10 {
		t.Errorf("only %d dashboard queries", len(out))
	}
	return out
}

// selectorFamilies returns the families of the vector selectors in e.
func selectorFamilies(e parser.Expr) []family {
	var out []family
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if f, ok := lookup(vs.Name); ok {
				out = append(out, f)
			}
		}
		return nil
	})
	return out
}

// checkLabel returns a problem when label l is on none of fams.
func checkLabel(where string, fams []family, l string) []string {
	if l == "le" || slices.Contains(targetLabels, l) {
		return nil
	}
	for _, f := range fams {
		if slices.Contains(f.Labels, l) {
			return nil
		}
	}
	return []string{fmt.Sprintf("%s: label %q is on none of the queried families %v", where, l, names(fams))}
}

func names(fs []family) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Name)
	}
	return out
}

var simpleAlternatives = regexp.MustCompile(`^[a-z_]+(\|[a-z_]+)*$`)

// checkQuery returns the problems of q: a selector naming a family not
// listed in queried (or by a __name__ matcher), a matcher or grouping label
// the family does not have, an enumerated label value ratelimitd never
// emits. It marks the families q uses in used.
func checkQuery(q query, used map[string]bool) []string {
	var probs []string
	fams := selectorFamilies(q.expr)
	parser.Inspect(q.expr, func(n parser.Node, _ []parser.Node) error {
		switch x := n.(type) {
		case *parser.VectorSelector:
			f, ok := lookup(x.Name)
			if !ok {
				probs = append(probs, fmt.Sprintf("%s: metric %q is not in the queried families list (deploy/rules_test.go)", q.where, x.Name))
				return nil
			}
			used[f.Name] = true
			for _, m := range x.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					continue
				}
				probs = append(probs, checkLabel(q.where, []family{f}, m.Name)...)
				allowed, enumerated := f.Values[m.Name]
				if !enumerated {
					continue
				}
				vals := []string{m.Value}
				if m.Type == labels.MatchRegexp || m.Type == labels.MatchNotRegexp {
					if !simpleAlternatives.MatchString(m.Value) {
						probs = append(probs, fmt.Sprintf("%s: %s%s%q: use plain alternatives of known values", q.where, m.Name, m.Type, m.Value))
						continue
					}
					vals = strings.Split(m.Value, "|")
				}
				for _, v := range vals {
					if !slices.Contains(allowed, v) {
						probs = append(probs, fmt.Sprintf("%s: %s=%q: ratelimitd emits only %v", q.where, m.Name, v, allowed))
					}
				}
			}
		case *parser.AggregateExpr:
			for _, l := range x.Grouping {
				probs = append(probs, checkLabel(q.where, fams, l)...)
			}
		}
		return nil
	})
	return probs
}

func TestRulesParseAndNameKnownMetrics(t *testing.T) {
	used := map[string]bool{}
	for _, q := range append(ruleQueries(t), dashboardQueries(t)...) {
		for _, p := range checkQuery(q, used) {
			t.Error(p)
		}
	}
	for _, f := range queried {
		if !used[f.Name] {
			t.Errorf("family %s is listed but no rule or panel queries it; drop it from the list", f.Name)
		}
	}
}

// TestOneCopy: the rules and the dashboard exist once. The paths plain
// Prometheus and Grafana users know (deploy/prometheus, deploy/grafana)
// are links to the chart's files; the chart's templates read those files
// (.Files.Get) rather than holding rules of their own; no other file under
// deploy/ defines a ratelimitd alert. deploy/helm's TestPrometheusRule and
// TestDashboard check the rendered objects carry the files unchanged.
func TestOneCopy(t *testing.T) {
	for link, target := range map[string]string{
		"prometheus/alerts.rules.yaml":      rulesFile,
		"grafana/ratelimitd-dashboard.json": dashboardFile,
	} {
		fi, err := os.Lstat(link)
		if err != nil {
			t.Errorf("%s: %v", link, err)
			continue
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is a file of its own; it must link to %s (one copy)", link, target)
			continue
		}
		if got, err := filepath.EvalSymlinks(link); err != nil || got != target {
			t.Errorf("%s resolves to %q (%v), want %s", link, got, err, target)
		}
	}
	for tpl, file := range map[string]string{
		"helm/ratelimitd/templates/prometheusrule.yaml":      `.Files.Get "files/alerts.rules.yaml"`,
		"helm/ratelimitd/templates/dashboard-configmap.yaml": `.Files.Get "files/ratelimitd-dashboard.json"`,
	} {
		b, err := os.ReadFile(tpl)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), file) {
			t.Errorf("%s does not read %s", tpl, file)
		}
	}
	alertDef := regexp.MustCompile(`(?m)^\s*-?\s*alert:\s*Ratelimitd`)
	n := 0
	filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&fs.ModeSymlink != 0 || strings.HasSuffix(p, ".go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if alertDef.Match(b) {
			n++
			if p != rulesFile {
				t.Errorf("%s defines ratelimitd alerts; the one copy is %s", p, rulesFile)
			}
		}
		return nil
	})
	if n != 1 {
		t.Errorf("%d files define ratelimitd alerts, want 1", n)
	}
}

// TestRulesWellFormed: names unique, durations valid, severity and
// annotations present, annotation templates parse as Prometheus templates.
func TestRulesWellFormed(t *testing.T) {
	plain := loadRules(t)
	seen := map[string]bool{}
	n := 0
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert name", g.Name)
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			for _, k := range []string{"summary", "description"} {
				a := r.Annotations[k]
				if a == "" {
					t.Errorf("alert %s: no %s", r.Alert, k)
					continue
				}
				// Prometheus prefixes $labels/$value definitions and adds
				// its template functions, as its alerting rules do.
				src := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}" + a
				tpl, err := template.New(r.Alert).Funcs(promTemplateFuncs).Option("missingkey=zero").Parse(src)
				if err != nil {
					t.Errorf("alert %s: %s template: %v", r.Alert, k, err)
					continue
				}
				var out strings.Builder
				data := struct {
					Labels, ExternalLabels map[string]string
					Value                  float64
				}{map[string]string{"domain": "d", "rule": "r", "namespace": "n", "job": "j", "pod": "p"}, nil, 0.5}
				if err := tpl.Execute(&out, data); err != nil {
					t.Errorf("alert %s: %s template: %v", r.Alert, k, err)
				}
				for _, l := range regexp.MustCompile(`\$labels\.([a-zA-Z_]+)`).FindAllStringSubmatch(a, -1) {
					if !strings.Contains(r.Expr, l[1]) {
						t.Errorf("alert %s: %s uses $labels.%s, which its expression does not keep", r.Alert, k, l[1])
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

var promTemplateFuncs = template.FuncMap{
	"humanize":           func(v float64) string { return fmt.Sprint(v) },
	"humanizePercentage": func(v float64) string { return fmt.Sprintf("%.1f%%", v*100) },
	"humanizeDuration":   func(v float64) string { return fmt.Sprintf("%gs", v) },
}

// TestRequiredSignals: the rules and the dashboard each cover the signals
// an operator needs: sustained 429 rate per domain, failed-open and
// failed-closed decisions, backend error rate, config reload failures, p99
// decision latency.
func TestRequiredSignals(t *testing.T) {
	signals := []struct {
		name string
		has  func(q query) bool
	}{
		{"429 rate per domain", func(q query) bool {
			return selects(q, "ratelimitd_requests_total", "code", "over_limit") && groupsBy(q, "domain")
		}},
		{"failed-open decisions", func(q query) bool { return selects(q, "ratelimitd_decisions_total", "result", "failed_open") }},
		{"failed-closed decisions", func(q query) bool { return selects(q, "ratelimitd_decisions_total", "result", "failed_closed") }},
		{"backend error rate", func(q query) bool { return selects(q, "ratelimitd_backend_errors_total", "", "") }},
		{"config reload failures", func(q query) bool { return selects(q, "ratelimitd_config_reloads_total", "result", "failure") }},
		{"p99 decision latency", func(q query) bool {
			s := q.expr.String()
			return strings.Contains(s, "histogram_quantile(0.99") && selects(q, "ratelimitd_request_duration_seconds_bucket", "", "")
		}},
	}
	for _, src := range []struct {
		name string
		qs   []query
	}{{"rules", ruleQueries(t)}, {"dashboard", dashboardQueries(t)}} {
		for _, s := range signals {
			if !slices.ContainsFunc(src.qs, s.has) {
				t.Errorf("%s: no query covers %s", src.name, s.name)
			}
		}
	}
}

// selects reports whether q has a selector of metric whose matcher on
// label accepts value ("" label: any selector of metric).
func selects(q query, metric, label, value string) bool {
	found := false
	parser.Inspect(q.expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok || vs.Name != metric {
			return nil
		}
		if label == "" {
			found = true
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == label && m.Matches(value) {
				found = true
			}
		}
		return nil
	})
	return found
}

func groupsBy(q query, label string) bool {
	found := false
	parser.Inspect(q.expr, func(n parser.Node, _ []parser.Node) error {
		if a, ok := n.(*parser.AggregateExpr); ok && !a.Without && slices.Contains(a.Grouping, label) {
			found = true
		}
		return nil
	})
	return found
}

// TestChecksReject proves the checks can fail: a parse error, an unknown
// metric, an unknown label, an unknown result value.
func TestChecksReject(t *testing.T) {
	if _, err := promql.ParseExpr(`sum by (domain) (rate(ratelimitd_requests_total[5m])`); err == nil {
		t.Error("unbalanced parenthesis parsed")
	}
	for _, c := range []struct{ expr, want string }{
		{`rate(ratelimitd_requests_totl[5m])`, "not in the queried families"},
		{`sum by (tenant) (rate(ratelimitd_requests_total[5m]))`, `label "tenant"`},
		{`rate(ratelimitd_decisions_total{result="denied"}[5m])`, `result="denied"`},
		{`rate(ratelimitd_decisions_total{result=~"ok|fail.*"}[5m])`, "plain alternatives"},
		{`rate(ratelimitd_requests_total{rule="x"}[5m])`, `label "rule"`},
	} {
		e, err := promql.ParseExpr(c.expr)
		if err != nil {
			t.Fatal(err)
		}
		probs := checkQuery(query{"case", e}, map[string]bool{})
		if !slices.ContainsFunc(probs, func(p string) bool { return strings.Contains(p, c.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", c.expr, probs, c.want)
		}
	}
}
