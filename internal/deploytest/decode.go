package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest document.
type Object struct {
	// Source is where the document came from: a manifest file relative to
	// the test's package, a chart template ("ratelimitd/templates/x.yaml"),
	// or "" for an object a renderer produced.
	Source string
	Kind   string // apiVersion/kind, e.g. "apps/v1/Deployment"
	Name   string // metadata.name ("" for a kind without ObjectMeta)
	Obj    any    // pointer to the typed struct
}

// String is "Kind Name (Source)", for test messages.
func (o Object) String() string { return fmt.Sprintf("%s %s (%s)", o.Kind, o.Name, o.Source) }

// ByKind is the objects of one apiVersion/kind, as their typed structs.
// It panics when an object of that kind is not a *T.
func ByKind[T any](objs []Object, gvk string) []*T {
	var out []*T
	for _, o := range objs {
		if o.Kind == gvk {
			out = append(out, o.Obj.(*T))
		}
	}
	return out
}

// CoreType is a new typed struct of k8s.io/api for apiVersion/kind
// ("apps/v1/Deployment"), among the kinds ratelimitd's manifests use, or
// nil.
func CoreType(gvk string) any {
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
	}
	return nil
}

// MetaOf is the ObjectMeta of a typed struct that embeds one (every
// k8s.io/api and Prometheus Operator object), or nil.
func MetaOf(obj any) *metav1.ObjectMeta {
	if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
		if m, ok := a.GetObjectMeta().(*metav1.ObjectMeta); ok {
			return m
		}
	}
	return nil
}

// DecodeStrict decodes one YAML document into the typed struct newTyped
// returns for its apiVersion/kind. Errors: duplicate keys
// (yaml.YAMLToJSONStrict), no apiVersion or kind, a kind newTyped does not
// know (nil), fields the type does not have (DisallowUnknownFields), wrong
// types, and trailing data.
func DecodeStrict(doc []byte, newTyped func(gvk string) any) (gvk string, obj any, err error) {
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
	if dec.More() {
		return gvk, nil, fmt.Errorf("%s: trailing data", gvk)
	}
	return gvk, obj, nil
}

// RejectedDocs are documents DecodeStrict must refuse with the core types
// (CoreType), by what is wrong with them: the decoder's own test cases.
var RejectedDocs = map[string]string{
	"unknown field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selectr: {a: b}\n",
	"wrong level":   "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nreplicas: 3\n",
	"duplicate key": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
	"unknown kind":  "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
	"wrong type":    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: three}\n",
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Documents splits a YAML stream at its "---" lines, every document kept
// (an empty or comment-only one too, see OnlyComments), in order.
func Documents(stream string) []string { return docSep.Split(stream, -1) }

// OnlyComments reports whether a YAML document holds nothing but comments
// and blank lines (a template whose condition is false).
func OnlyComments(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}
