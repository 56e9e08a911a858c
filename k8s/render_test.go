package k8s_test

// A small, strict stand-in for `kustomize build`: it decodes every manifest
// into Kubernetes' own API types (unknown fields are errors), follows the
// kustomization.yaml files of this directory (resources, namespace, labels,
// configMapGenerator, images, strategic-merge patches of container env), and
// returns the rendered objects so the tests can check them as a cluster
// would see them. It supports exactly the kustomize features used here and
// fails on any other, so a new feature needs a matching line below.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kustomization is the subset of kustomize.config.k8s.io/v1beta1
// Kustomization these manifests use; decoding is strict, so any other field
// is reported as unknown.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources,omitempty"`
	Patches   []struct {
		Path string `json:"path"`
	} `json:"patches,omitempty"`
	ConfigMapGenerator []struct {
		Name    string   `json:"name"`
		Files   []string `json:"files"`
		Options *struct {
			DisableNameSuffixHash bool `json:"disableNameSuffixHash,omitempty"`
		} `json:"options,omitempty"`
	} `json:"configMapGenerator,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// envoyFilter is networking.istio.io/v1alpha3 EnvoyFilter as far as these
// manifests use it. Patch values stay raw: they are Envoy protos, decoded
// with go-control-plane in istio_test.go.
type envoyFilter struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		WorkloadSelector *struct {
			Labels map[string]string `json:"labels"`
		} `json:"workloadSelector,omitempty"`
		ConfigPatches []envoyConfigPatch `json:"configPatches"`
	} `json:"spec"`
}

type envoyConfigPatch struct {
	ApplyTo string `json:"applyTo"`
	Match   struct {
		Context  string `json:"context"`
		Listener *struct {
			FilterChain struct {
				Filter struct {
					Name      string `json:"name"`
					SubFilter *struct {
						Name string `json:"name"`
					} `json:"subFilter,omitempty"`
				} `json:"filter"`
			} `json:"filterChain"`
		} `json:"listener,omitempty"`
		RouteConfiguration *struct {
			Vhost struct {
				Name  string `json:"name,omitempty"`
				Route *struct {
					Name   string `json:"name,omitempty"`
					Action string `json:"action,omitempty"`
				} `json:"route,omitempty"`
			} `json:"vhost"`
		} `json:"routeConfiguration,omitempty"`
	} `json:"match"`
	Patch struct {
		Operation string          `json:"operation"`
		Value     json.RawMessage `json:"value"`
	} `json:"patch"`
}

// object is one decoded manifest document.
type object struct {
	File string // path relative to k8s/
	Kind string // "apps/v1/Deployment", ...
	Name string
	Obj  any // pointer to the typed struct
}

func (o object) String() string { return fmt.Sprintf("%s %s (%s)", o.Kind, o.Name, o.File) }

// newTyped returns a pointer to the typed struct for apiVersion/kind, or nil.
func newTyped(gvk string) any {
	switch gvk {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &kustomization{}
	case "networking.istio.io/v1alpha3/EnvoyFilter":
		return &envoyFilter{}
	}
	return nil
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeStrict decodes one YAML document into the typed struct its
// apiVersion and kind name: duplicate keys (yaml.YAMLToJSONStrict) and
// fields the type does not have (DisallowUnknownFields) are errors.
func decodeStrict(doc []byte) (gvk string, obj any, err error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "", nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return "", nil, err
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return "", nil, fmt.Errorf("apiVersion and kind are required")
	}
	gvk = tm.APIVersion + "/" + tm.Kind
	obj = newTyped(gvk)
	if obj == nil {
		return gvk, nil, fmt.Errorf("%s: no API type known to this test", gvk)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return gvk, nil, fmt.Errorf("%s: %w", gvk, err)
	}
	return gvk, obj, nil
}

// decodeFile decodes every document of a YAML file (rel is relative to k8s/).
func decodeFile(rel string) ([]object, error) {
	b, err := os.ReadFile(rel)
	if err != nil {
		return nil, err
	}
	var out []object
	for i, doc := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		gvk, obj, err := decodeStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", rel, i+1, err)
		}
		out = append(out, object{File: rel, Kind: gvk, Name: metaOf(obj).Name, Obj: obj})
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// metaOf returns the ObjectMeta of a decoded object (a zero one for a
// Kustomization).
func metaOf(obj any) *metav1.ObjectMeta {
	switch o := obj.(type) {
	case *corev1.Namespace:
		return &o.ObjectMeta
	case *corev1.ServiceAccount:
		return &o.ObjectMeta
	case *corev1.Service:
		return &o.ObjectMeta
	case *corev1.ConfigMap:
		return &o.ObjectMeta
	case *corev1.Secret:
		return &o.ObjectMeta
	case *appsv1.Deployment:
		return &o.ObjectMeta
	case *appsv1.StatefulSet:
		return &o.ObjectMeta
	case *autoscalingv2.HorizontalPodAutoscaler:
		return &o.ObjectMeta
	case *policyv1.PodDisruptionBudget:
		return &o.ObjectMeta
	case *networkingv1.NetworkPolicy:
		return &o.ObjectMeta
	case *envoyFilter:
		return &o.Metadata
	}
	return &metav1.ObjectMeta{}
}

// rendered is the output of one kustomization.
type rendered struct {
	Dir     string
	Objects []object
}

// byKind returns the rendered objects of one apiVersion/kind.
func byKind[T any](r rendered, gvk string) []*T {
	var out []*T
	for _, o := range r.Objects {
		if o.Kind == gvk {
			out = append(out, o.Obj.(*T))
		}
	}
	return out
}

// render builds the kustomization in dir (relative to k8s/).
func render(t *testing.T, dir string) rendered {
	t.Helper()
	r, err := renderDir(dir, nil)
	if err != nil {
		t.Fatalf("render %s: %v", dir, err)
	}
	return r
}

func renderDir(dir string, seen []string) (rendered, error) {
	dir = filepath.Clean(dir)
	if slices.Contains(seen, dir) {
		return rendered{}, fmt.Errorf("kustomization cycle: %v -> %s", seen, dir)
	}
	seen = append(seen, dir)
	kfile := filepath.Join(dir, "kustomization.yaml")
	objs, err := decodeFile(kfile)
	if err != nil {
		return rendered{}, err
	}
	if len(objs) != 1 || objs[0].Kind != "kustomize.config.k8s.io/v1beta1/Kustomization" {
		return rendered{}, fmt.Errorf("%s: want exactly one Kustomization", kfile)
	}
	k := objs[0].Obj.(*kustomization)
	out := rendered{Dir: dir}
	for _, res := range k.Resources {
		p := filepath.Join(dir, res)
		fi, err := os.Stat(p)
		if err != nil {
			return out, fmt.Errorf("%s: resource %q: %w", kfile, res, err)
		}
		if fi.IsDir() {
			sub, err := renderDir(p, seen)
			if err != nil {
				return out, err
			}
			out.Objects = append(out.Objects, sub.Objects...)
			continue
		}
		docs, err := decodeFile(p)
		if err != nil {
			return out, err
		}
		for _, o := range docs {
			if strings.HasPrefix(o.Kind, "kustomize.config.k8s.io/") {
				return out, fmt.Errorf("%s: resource %q is a Kustomization file; list its directory", kfile, res)
			}
		}
		out.Objects = append(out.Objects, docs...)
	}
	for _, g := range k.ConfigMapGenerator {
		if g.Options == nil || !g.Options.DisableNameSuffixHash {
			return out, fmt.Errorf("%s: configMapGenerator %q: this renderer (and hot reload) needs disableNameSuffixHash: true", kfile, g.Name)
		}
		cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, Data: map[string]string{}}
		cm.Name = g.Name
		for _, f := range g.Files {
			if strings.Contains(f, "=") {
				return out, fmt.Errorf("%s: configMapGenerator file %q: key=path is not supported here", kfile, f)
			}
			rel, err := filepath.Rel(dir, filepath.Join(dir, f))
			if err != nil || strings.HasPrefix(rel, "..") {
				return out, fmt.Errorf("%s: configMapGenerator file %q is outside the kustomization directory (kustomize's load restrictor rejects it)", kfile, f)
			}
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return out, fmt.Errorf("%s: configMapGenerator: %w", kfile, err)
			}
			cm.Data[filepath.Base(f)] = string(b)
		}
		out.Objects = append(out.Objects, object{File: kfile, Kind: "v1/ConfigMap", Name: cm.Name, Obj: cm})
	}
	for _, p := range k.Patches {
		pf := filepath.Join(dir, p.Path)
		pos, err := decodeFile(pf)
		if err != nil {
			return out, fmt.Errorf("%s: patch: %w", kfile, err)
		}
		for _, po := range pos {
			if err := applyPatch(&out, po); err != nil {
				return out, fmt.Errorf("%s: %w", pf, err)
			}
		}
	}
	for _, l := range k.Labels {
		if l.IncludeSelectors || l.IncludeTemplates {
			return out, fmt.Errorf("%s: labels with includeSelectors/includeTemplates are not supported here", kfile)
		}
		for _, o := range out.Objects {
			m := metaOf(o.Obj)
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			for k, v := range l.Pairs {
				m.Labels[k] = v
			}
		}
	}
	if k.Namespace != "" {
		for _, o := range out.Objects {
			if o.Kind == "v1/Namespace" {
				continue
			}
			metaOf(o.Obj).Namespace = k.Namespace
		}
	}
	for _, img := range k.Images {
		for _, o := range out.Objects {
			for _, c := range podContainers(o) {
				name, _, _ := strings.Cut(c.Image, ":")
				if name != img.Name {
					continue
				}
				if img.NewName != "" {
					name = img.NewName
				}
				c.Image = name
				if img.NewTag != "" {
					c.Image += ":" + img.NewTag
				}
			}
		}
	}
	return out, nil
}

// podContainers returns pointers to the containers of a workload object.
func podContainers(o object) []*corev1.Container {
	var spec *corev1.PodSpec
	switch w := o.Obj.(type) {
	case *appsv1.Deployment:
		spec = &w.Spec.Template.Spec
	case *appsv1.StatefulSet:
		spec = &w.Spec.Template.Spec
	default:
		return nil
	}
	var out []*corev1.Container
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// applyPatch applies a strategic-merge patch that may only add or replace
// container env entries (merged by container name, then env name), which
// is all the overlays here do. Anything else in the patch is an error, so
// the test never silently ignores part of a patch.
func applyPatch(r *rendered, p object) error {
	pd, ok := p.Obj.(*appsv1.Deployment)
	if !ok {
		return fmt.Errorf("patch %s: only Deployment patches are supported here", p)
	}
	var target *appsv1.Deployment
	for _, o := range r.Objects {
		if d, ok := o.Obj.(*appsv1.Deployment); ok && d.Name == pd.Name {
			target = d
		}
	}
	if target == nil {
		return fmt.Errorf("patch %s: no Deployment %q among the resources", p, pd.Name)
	}
	rest := pd.DeepCopy()
	rest.TypeMeta, rest.ObjectMeta = metav1.TypeMeta{}, metav1.ObjectMeta{}
	for i := range rest.Spec.Template.Spec.Containers {
		rest.Spec.Template.Spec.Containers[i] = corev1.Container{}
	}
	rest.Spec.Template.Spec.Containers = nil
	if !isZero(rest) {
		return fmt.Errorf("patch %s: sets fields other than containers[].env, which this renderer does not merge", p)
	}
	for _, pc := range pd.Spec.Template.Spec.Containers {
		probe := pc.DeepCopy()
		probe.Name, probe.Env = "", nil
		if !isZero(probe) {
			return fmt.Errorf("patch %s: container %q sets fields other than env", p, pc.Name)
		}
		var tc *corev1.Container
		for i := range target.Spec.Template.Spec.Containers {
			if target.Spec.Template.Spec.Containers[i].Name == pc.Name {
				tc = &target.Spec.Template.Spec.Containers[i]
			}
		}
		if tc == nil {
			return fmt.Errorf("patch %s: no container %q in Deployment %q", p, pc.Name, pd.Name)
		}
		for _, e := range pc.Env {
			i := slices.IndexFunc(tc.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name })
			if i >= 0 {
				tc.Env[i] = e
			} else {
				tc.Env = append(tc.Env, e)
			}
		}
	}
	return nil
}

func isZero(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return false
	}
	return emptyJSON(m)
}

// emptyJSON reports whether a JSON value holds nothing but empty objects
// (Kubernetes types marshal zero structs such as creationTimestamp: null
// and empty specs).
func emptyJSON(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case float64:
		return x == 0
	case map[string]any:
		for _, e := range x {
			if !emptyJSON(e) {
				return false
			}
		}
		return true
	case []any:
		return len(x) == 0
	}
	return false
}
