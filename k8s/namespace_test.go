package k8s_test

import (
	"net"
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// namespace is where every kustomization of a workload puts its objects:
// the base's Namespace, which ratelimitd's Service URLs resolve in.
const namespace = "ratelimitd"

// clusterScoped are the kinds without a namespace among those rendered.
var clusterScoped = map[string]bool{
	"v1/Namespace": true,
	"rbac.authorization.k8s.io/v1/ClusterRole":        true,
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": true,
}

// TestOverlaysOneNamespace renders every workload kustomization and checks
// each namespaced object lands in the ratelimitd namespace: an overlay's
// own resource without one would go to kubectl's current namespace, where
// ratelimitd's short Service names (redis://redis:6379) do not resolve.
func TestOverlaysOneNamespace(t *testing.T) {
	for _, dir := range workloads {
		r := render(t, dir)
		for _, o := range r.Objects {
			ns := metaOf(o.Obj).Namespace
			switch {
			case clusterScoped[o.Kind] && ns != "":
				t.Errorf("%s: cluster-scoped %s %s has namespace %q", dir, o.Kind, o.Name, ns)
			case !clusterScoped[o.Kind] && ns != namespace:
				t.Errorf("%s: %s %s is in namespace %q, want %q", dir, o.Kind, o.Name, ns, namespace)
			}
		}
	}
}

// selfContained are the kustomizations that render every Service
// ratelimitd names; the base and overlays/durable expect a Redis Service
// "redis" from elsewhere (docs/kubernetes.md).
var selfContained = map[string]bool{"overlays/redis": true, "overlays/dev": true}

// TestServiceURLsResolve checks that every in-cluster host a ratelimitd
// environment value names (a URL's host, or a host:port list) resolves to
// a Service the kustomization renders when it renders one of that name, and
// always for a self-contained kustomization. Hosts outside the cluster (a
// dotted name not under .svc) are the operator's.
func TestServiceURLsResolve(t *testing.T) {
	checked := 0
	for _, dir := range workloads {
		r := render(t, dir)
		d, c := ratelimitd(t, r)
		for _, e := range c.Env {
			for _, host := range envHosts(e.Value) {
				name, ns, inCluster := clusterService(host, d.Namespace)
				if !inCluster {
					continue
				}
				checked++
				if ns != namespace {
					t.Errorf("%s: %s names host %q in namespace %q, want %q", dir, e.Name, host, ns, namespace)
				}
				svcs := byName[corev1.Service](r, "v1/Service", name)
				found := false
				for _, s := range svcs {
					found = found || s.Namespace == ns
				}
				if !found && (len(svcs) > 0 || selfContained[dir]) {
					t.Errorf("%s: %s names host %q: no Service %s in namespace %q", dir, e.Name, host, name, ns)
				}
			}
		}
	}
	if checked == 0 {
		t.Errorf("no in-cluster Service URL found in any kustomization; the test checks nothing")
	}
}

// envHosts returns the hosts an environment value names: a URL's host, or
// each host of a comma-separated host:port list.
func envHosts(v string) []string {
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		return []string{u.Hostname()}
	}
	var out []string
	for _, part := range strings.Split(v, ",") {
		if h, p, err := net.SplitHostPort(strings.TrimSpace(part)); err == nil && h != "" && p != "" {
			out = append(out, h)
		}
	}
	return out
}

// clusterService says whether host is a Service in the cluster's DNS as
// seen from a pod in namespace from (name, name.ns, name.ns.svc,
// name.ns.svc.cluster.local) and which. IP addresses and localhost are not.
func clusterService(host, from string) (name, ns string, ok bool) {
	if net.ParseIP(host) != nil || host == "localhost" {
		return "", "", false
	}
	host = strings.TrimSuffix(strings.TrimSuffix(host, "."), ".cluster.local")
	parts := strings.Split(host, ".")
	switch {
	case len(parts) == 1:
		return parts[0], from, true
	case len(parts) == 2:
		// name.ns is a Service only if it is not an external name; the
		// manifests use no two-label external hosts.
		return parts[0], parts[1], true
	case len(parts) == 3 && parts[2] == "svc":
		return parts[0], parts[1], true
	}
	return "", "", false
}
