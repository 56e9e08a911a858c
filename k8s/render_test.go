package k8s_test

// Rendering: every kustomization here is built with kustomize's own library
// (sigs.k8s.io/kustomize/api/krusty, what `kubectl apply -k` runs), and
// every rendered object, like every manifest file, is decoded into
// Kubernetes' own API types with unknown fields and duplicate keys as
// errors, so the tests check the objects as a cluster would receive them.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomization is kustomize.config.k8s.io/v1beta1 Kustomization, kustomize's
// own type: a misspelt field of a kustomization.yaml is an error.
type kustomization = kusttypes.Kustomization

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
	File string // path relative to k8s/ (a manifest file; "" for a rendered object)
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
	r, err := renderDir(dir)
	if err != nil {
		t.Fatalf("render %s: %v", dir, err)
	}
	return r
}

// renderDir runs kustomize on dir with its defaults (load restrictor on,
// no plugins) and decodes every rendered object strictly.
func renderDir(dir string) (rendered, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return rendered{}, err
	}
	// The kustomization files themselves, strictly against kustomize's type.
	if _, err := decodeFile(filepath.Join(dir, "kustomization.yaml")); err != nil {
		return rendered{}, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return rendered{}, err
	}
	out := rendered{Dir: dir}
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			return out, err
		}
		gvk, obj, err := decodeStrict(y)
		if err != nil {
			return out, fmt.Errorf("%s: rendered %s: %w", dir, res.CurId(), err)
		}
		out.Objects = append(out.Objects, object{Kind: gvk, Name: metaOf(obj).Name, Obj: obj})
	}
	return out, nil
}
