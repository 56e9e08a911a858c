package k8s_test

// Rendering: every kustomization here is built with kustomize's own library
// (sigs.k8s.io/kustomize/api/krusty, what `kubectl apply -k` runs), and
// every rendered object, like every manifest file, is decoded into
// Kubernetes' own API types with unknown fields and duplicate keys as
// errors, so the tests check the objects as a cluster would receive them.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
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

// object is one decoded manifest document; its Source is the file,
// relative to k8s/ ("" for a rendered object).
type object = deploytest.Object

// newTyped returns a pointer to the typed struct for apiVersion/kind, or nil.
func newTyped(gvk string) any {
	switch gvk {
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &kustomization{}
	case "networking.istio.io/v1alpha3/EnvoyFilter":
		return &envoyFilter{}
	}
	return deploytest.CoreType(gvk)
}

// decodeStrict decodes one YAML document into the typed struct its
// apiVersion and kind name (deploytest.DecodeStrict with newTyped).
func decodeStrict(doc []byte) (gvk string, obj any, err error) {
	return deploytest.DecodeStrict(doc, newTyped)
}

// decodeFile decodes every document of a YAML file (rel is relative to k8s/).
func decodeFile(rel string) ([]object, error) {
	b, err := os.ReadFile(rel)
	if err != nil {
		return nil, err
	}
	var out []object
	for i, doc := range deploytest.Documents(string(b)) {
		if deploytest.OnlyComments(doc) {
			continue
		}
		gvk, obj, err := decodeStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", rel, i+1, err)
		}
		out = append(out, object{Source: rel, Kind: gvk, Name: metaOf(obj).Name, Obj: obj})
	}
	return out, nil
}

// metaOf returns the ObjectMeta of a decoded object (a zero one for a
// Kustomization).
func metaOf(obj any) *metav1.ObjectMeta {
	if f, ok := obj.(*envoyFilter); ok {
		return &f.Metadata
	}
	if m := deploytest.MetaOf(obj); m != nil {
		return m
	}
	return &metav1.ObjectMeta{}
}

// rendered is the output of one kustomization.
type rendered struct {
	Dir     string
	Objects []object
}

// byKind returns the rendered objects of one apiVersion/kind.
func byKind[T any](r rendered, gvk string) []*T { return deploytest.ByKind[T](r.Objects, gvk) }

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
