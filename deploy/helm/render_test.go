// Package helm_test renders the ratelimitd chart (deploy/helm/ratelimitd)
// in process with Helm's own library, as `helm install` and `helm template`
// render it, and checks the objects as a cluster would receive them: every
// document is decoded strictly (unknown fields and duplicate keys are
// errors) into the Kubernetes API types of k8s.io/api or the Prometheus
// Operator's types, and the tests then assert what the values promise.
package helm_test

import (
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// chartDir is the chart, relative to this package.
const chartDir = "ratelimitd"

var (
	chartOnce sync.Once
	theChart  *chart.Chart
	chartErr  error
)

// loadChart loads the chart directory once, as `helm install ./ratelimitd`
// loads it (Chart.yaml, values.yaml, templates/, files/, .helmignore).
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chartOnce.Do(func() { theChart, chartErr = loader.Load(chartDir) })
	if chartErr != nil {
		t.Fatalf("load chart %s: %v", chartDir, chartErr)
	}
	return theChart
}

// object is one rendered Kubernetes object; its Source is the template,
// e.g. ratelimitd/templates/deployment.yaml.
type object = deploytest.Object

// release is one rendered release: its objects and NOTES.txt.
type release struct {
	Name, Namespace string
	Objects         []object
	Notes           string
}

// newTyped returns a pointer to the API type of apiVersion/kind, or nil:
// the core kinds and the Prometheus Operator's.
func newTyped(gvk string) any {
	switch gvk {
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PodMonitor":
		return &monitoringv1.PodMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return deploytest.CoreType(gvk)
}

func metaOf(obj any) *metav1.ObjectMeta {
	if m := deploytest.MetaOf(obj); m != nil {
		return m
	}
	panic(fmt.Sprintf("metaOf: %T", obj))
}

// decodeStrict decodes one YAML document into the type its apiVersion and
// kind name (deploytest.DecodeStrict with newTyped).
func decodeStrict(doc []byte) (string, any, error) { return deploytest.DecodeStrict(doc, newTyped) }

// renderValues renders the chart with user values (YAML, as in a -f
// values file) into release name in namespace ns, the way `helm install
// --dry-run` does without a cluster: values coalesced with values.yaml and
// checked against values.schema.json, then every template executed.
func renderValues(t *testing.T, name, ns, values string) (release, error) {
	t.Helper()
	ch := loadChart(t)
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v\n%s", err, values)
	}
	opts := chartutil.ReleaseOptions{Name: name, Namespace: ns, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals.AsMap(), opts, chartutil.DefaultCapabilities)
	if err != nil {
		return release{}, err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return release{}, err
	}
	rel := release{Name: name, Namespace: ns}
	var keys []string
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		base := path.Base(k)
		switch {
		case base == "NOTES.txt":
			rel.Notes = out[k]
			continue
		case strings.HasPrefix(base, "_"):
			continue // partials render nothing of their own
		}
		for i, doc := range deploytest.Documents(out[k]) {
			if deploytest.OnlyComments(doc) {
				continue
			}
			gvk, obj, err := decodeStrict([]byte(doc))
			if err != nil {
				return rel, fmt.Errorf("%s: document %d: %w\n%s", k, i+1, err, doc)
			}
			rel.Objects = append(rel.Objects, object{Source: k, Kind: gvk, Name: metaOf(obj).Name, Obj: obj})
		}
	}
	return rel, nil
}

// render is renderValues for release "ratelimitd" in namespace
// "ratelimitd" that must succeed.
func render(t *testing.T, values string) release {
	t.Helper()
	return renderAs(t, "ratelimitd", "ratelimitd", values)
}

func renderAs(t *testing.T, name, ns, values string) release {
	t.Helper()
	r, err := renderValues(t, name, ns, values)
	if err != nil {
		t.Fatalf("render with values\n%s\n: %v", values, err)
	}
	return r
}

// renderFails renders values that the chart must refuse, with an error
// containing want.
func renderFails(t *testing.T, values, want string) {
	t.Helper()
	_, err := renderValues(t, "ratelimitd", "ratelimitd", values)
	if err == nil {
		t.Errorf("values\n%s\nrendered; want an error containing %q", values, want)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("values\n%s\nfailed with %v; want an error containing %q", values, err, want)
	}
}

func byKind[T any](r release, gvk string) []*T { return deploytest.ByKind[T](r.Objects, gvk) }

// one returns the single object of a kind, failing otherwise.
func one[T any](t *testing.T, r release, gvk string) *T {
	t.Helper()
	objs := byKind[T](r, gvk)
	if len(objs) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(objs), gvk)
	}
	return objs[0]
}

// deployment returns the ratelimitd Deployment and its container.
func deployment(t *testing.T, r release) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := one[appsv1.Deployment](t, r, "apps/v1/Deployment")
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "ratelimitd" {
			return d, &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("no container ratelimitd")
	return nil, nil
}

// args returns the container's --flag=value args as flag -> values.
func args(t *testing.T, c *corev1.Container) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range c.Args {
		if !strings.HasPrefix(a, "--") {
			t.Errorf("arg %q: every chart arg is --flag=value", a)
			continue
		}
		name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			t.Errorf("arg %q: want --flag=value (a separate value would be read as a flag or an argument)", a)
		}
		out[name] = append(out[name], val)
	}
	return out
}

// arg returns the single value of --name, or "" and false.
func arg(t *testing.T, c *corev1.Container, name string) (string, bool) {
	t.Helper()
	v := args(t, c)[name]
	switch len(v) {
	case 0:
		return "", false
	case 1:
		return v[0], true
	}
	t.Errorf("--%s given %d times: %q", name, len(v), v)
	return v[len(v)-1], true
}

func mustArg(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	v, ok := arg(t, c, name)
	if !ok {
		t.Fatalf("no --%s in args %q", name, c.Args)
	}
	return v
}
