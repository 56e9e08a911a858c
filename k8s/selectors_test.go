// Selectors, ports and network policies: each selects the pods it means
// and names ports those pods have.

package k8s_test

import (
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// podTemplate is a workload's pod template with where it came from.
type podTemplate struct {
	Owner string
	Tpl   *corev1.PodTemplateSpec
}

func podTemplates(r rendered) []podTemplate {
	var out []podTemplate
	for _, d := range byKind[appsv1.Deployment](r, "apps/v1/Deployment") {
		out = append(out, podTemplate{"Deployment " + d.Name, &d.Spec.Template})
	}
	for _, s := range byKind[appsv1.StatefulSet](r, "apps/v1/StatefulSet") {
		out = append(out, podTemplate{"StatefulSet " + s.Name, &s.Spec.Template})
	}
	return out
}

// selected returns the pod templates a selector picks.
func selected(r rendered, s labels.Selector) []podTemplate {
	var out []podTemplate
	for _, pt := range podTemplates(r) {
		if s.Matches(labels.Set(pt.Tpl.Labels)) {
			out = append(out, pt)
		}
	}
	return out
}

// containerPort resolves a named or numbered port against a pod template.
func containerPort(pt podTemplate, p string) (int32, bool) {
	for _, c := range pt.Tpl.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == p || strconv.Itoa(int(cp.ContainerPort)) == p {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// TestSelectorsMatchLabels checks every selector picks the pods it is
// meant for, and every port it names exists on them.
func TestSelectorsMatchLabels(t *testing.T) {
	for _, dir := range workloads {
		r := render(t, dir)
		t.Run(dir, func(t *testing.T) {
			for _, d := range byKind[appsv1.Deployment](r, "apps/v1/Deployment") {
				if !deploytest.MustSelector(t, "Deployment "+d.Name, d.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("Deployment %s: selector does not match its pod template labels", d.Name)
				}
				for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
					if !deploytest.MustSelector(t, "topologySpread", tsc.LabelSelector).Matches(labels.Set(d.Spec.Template.Labels)) {
						t.Errorf("Deployment %s: topologySpreadConstraint %s selects other pods", d.Name, tsc.TopologyKey)
					}
				}
			}
			for _, s := range byKind[appsv1.StatefulSet](r, "apps/v1/StatefulSet") {
				if !deploytest.MustSelector(t, "StatefulSet "+s.Name, s.Spec.Selector).Matches(labels.Set(s.Spec.Template.Labels)) {
					t.Errorf("StatefulSet %s: selector does not match its pod template labels", s.Name)
				}
				if len(byName[corev1.Service](r, "v1/Service", s.Spec.ServiceName)) == 0 {
					t.Errorf("StatefulSet %s: serviceName %q is no Service", s.Name, s.Spec.ServiceName)
				}
			}
			for _, svc := range byKind[corev1.Service](r, "v1/Service") {
				if len(svc.Spec.Selector) == 0 {
					t.Errorf("Service %s: no selector", svc.Name)
					continue
				}
				pods := selected(r, labels.SelectorFromSet(svc.Spec.Selector))
				if len(pods) != 1 {
					t.Errorf("Service %s: selects %d workloads, want 1", svc.Name, len(pods))
					continue
				}
				for _, p := range svc.Spec.Ports {
					if _, ok := containerPort(pods[0], p.TargetPort.String()); !ok {
						t.Errorf("Service %s port %s: targetPort %s is no container port of %s", svc.Name, p.Name, p.TargetPort.String(), pods[0].Owner)
					}
				}
			}
			for _, pdb := range byKind[policyv1.PodDisruptionBudget](r, "policy/v1/PodDisruptionBudget") {
				if n := len(selected(r, deploytest.MustSelector(t, "PDB", pdb.Spec.Selector))); n != 1 {
					t.Errorf("PodDisruptionBudget %s selects %d workloads, want 1", pdb.Name, n)
				}
			}
			for _, hpa := range byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler") {
				ref := hpa.Spec.ScaleTargetRef
				if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || len(byName[appsv1.Deployment](r, "apps/v1/Deployment", ref.Name)) == 0 {
					t.Errorf("HorizontalPodAutoscaler %s: scaleTargetRef %+v is no Deployment here", hpa.Name, ref)
				}
			}
			for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
				targets := selected(r, deploytest.MustSelector(t, "NetworkPolicy", &np.Spec.PodSelector))
				if len(targets) != 1 {
					t.Errorf("NetworkPolicy %s selects %d workloads, want 1", np.Name, len(targets))
					continue
				}
				for _, in := range np.Spec.Ingress {
					for _, p := range in.Ports {
						if _, ok := containerPort(targets[0], p.Port.String()); !ok {
							t.Errorf("NetworkPolicy %s: ingress port %s is no container port of %s", np.Name, p.Port.String(), targets[0].Owner)
						}
					}
					checkPeers(t, r, np.Name, in.From)
				}
				for _, eg := range np.Spec.Egress {
					checkPeers(t, r, np.Name, eg.To)
				}
			}
		})
	}
}

// checkPeers: a peer that names pods in the policy's own namespace (no
// namespaceSelector) must select a workload rendered here.
func checkPeers(t *testing.T, r rendered, np string, peers []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	for _, p := range peers {
		if p.PodSelector != nil && p.NamespaceSelector == nil {
			if len(selected(r, deploytest.MustSelector(t, "peer", p.PodSelector))) == 0 {
				t.Errorf("NetworkPolicy %s: peer %v selects no pod of this deployment", np, p.PodSelector.MatchLabels)
			}
		}
	}
}

func ratelimitdPodLabels(t *testing.T, r rendered) map[string]string {
	d, _ := ratelimitd(t, r)
	return d.Spec.Template.Labels
}

// TestNetworkPolicyGRPC: only the proxies reach the gRPC port, only the
// monitoring namespace the metrics port, and egress is closed by default.
func TestNetworkPolicyGRPC(t *testing.T) {
	r := render(t, "base")
	nps := byName[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy", "ratelimitd")
	if len(nps) != 1 {
		t.Fatalf("no NetworkPolicy ratelimitd")
	}
	np := nps[0]
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("policyTypes %v: want Ingress and Egress", np.Spec.PolicyTypes)
	}
	for _, in := range np.Spec.Ingress {
		if len(in.From) == 0 || len(in.Ports) == 0 {
			t.Errorf("ingress rule %+v admits every source or every port", in)
		}
		for _, f := range in.From {
			if f.IPBlock != nil || (f.PodSelector == nil && f.NamespaceSelector == nil) {
				t.Errorf("ingress peer %+v is not a pod or namespace selector", f)
			}
			if f.NamespaceSelector != nil && len(f.NamespaceSelector.MatchLabels)+len(f.NamespaceSelector.MatchExpressions) == 0 &&
				(f.PodSelector == nil || len(f.PodSelector.MatchLabels)+len(f.PodSelector.MatchExpressions) == 0) {
				t.Errorf("ingress peer %+v admits every pod of every namespace", f)
			}
		}
		for _, p := range in.Ports {
			if p.Port.String() == "grpc" {
				continue
			}
			for _, f := range in.From {
				if f.NamespaceSelector == nil || f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
					t.Errorf("port %s is open to %+v; only gRPC is for proxies, metrics for monitoring", p.Port.String(), f)
				}
			}
		}
	}
	for _, eg := range np.Spec.Egress {
		for _, p := range eg.Ports {
			if p.Port.IntValue() != 53 {
				t.Errorf("base egress allows port %s; base allows DNS only (overlays add Redis)", p.Port.String())
			}
		}
	}
}
