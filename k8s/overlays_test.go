// What the overlays change: the Redis wiring, and the memory store's
// single replica.

package k8s_test

import (
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// TestOverlayRedis checks each overlay's Redis wiring.
func TestOverlayRedis(t *testing.T) {
	t.Run("redis", testRedisOverlay)
	t.Run("production", testProductionOverlay)
}

// testRedisOverlay checks overlays/redis: its Redis wiring and the
// NetworkPolicy that guards Redis.
func testRedisOverlay(t *testing.T) {
	r := render(t, "overlays/redis")
	_, c := ratelimitd(t, r)
	if got := envValue(c, "RATELIMITD_BACKEND"); got != "redis" {
		t.Errorf("RATELIMITD_BACKEND = %q, want redis", got)
	}
	u, err := url.Parse(envValue(c, "RATELIMITD_REDIS_URL"))
	if err != nil || u.Scheme != "redis" {
		t.Fatalf("RATELIMITD_REDIS_URL = %q: want redis://host:port/db (%v)", envValue(c, "RATELIMITD_REDIS_URL"), err)
	}
	svcs := byName[corev1.Service](r, "v1/Service", u.Hostname())
	if len(svcs) != 1 {
		t.Fatalf("RATELIMITD_REDIS_URL host %q is no Service of the overlay", u.Hostname())
	}
	if !slices.ContainsFunc(svcs[0].Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == u.Port() }) {
		t.Errorf("RATELIMITD_REDIS_URL port %s is no port of Service %s", u.Port(), u.Hostname())
	}
	sts := byName[appsv1.StatefulSet](r, "apps/v1/StatefulSet", "redis")
	if len(sts) != 1 {
		t.Fatalf("no Redis StatefulSet")
	}
	pods := selected(r, labels.SelectorFromSet(svcs[0].Spec.Selector))
	if len(pods) != 1 || pods[0].Tpl != &sts[0].Spec.Template {
		t.Errorf("Service %s does not select the Redis StatefulSet", u.Hostname())
	}
	args := strings.Join(sts[0].Spec.Template.Spec.Containers[0].Args, " ")
	if !regexp.MustCompile(`--maxmemory-policy noeviction\b`).MatchString(args) {
		t.Errorf("Redis args %q: want --maxmemory-policy noeviction (evicting keys silently resets limits)", args)
	}
	if !regexp.MustCompile(`--maxmemory \d+[kmg]b\b`).MatchString(args) {
		t.Errorf("Redis args %q: want --maxmemory below the container memory limit", args)
	}
	// Only ratelimitd may reach Redis.
	var guarded bool
	for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
		if !deploytest.MustSelector(t, "np", &np.Spec.PodSelector).Matches(labels.Set(sts[0].Spec.Template.Labels)) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		guarded = true
		for _, in := range np.Spec.Ingress {
			if len(in.From) == 0 {
				t.Errorf("NetworkPolicy %s admits every source to Redis", np.Name)
			}
			for _, p := range in.From {
				if p.PodSelector == nil || p.NamespaceSelector != nil || p.IPBlock != nil ||
					!deploytest.MustSelector(t, "from", p.PodSelector).Matches(labels.Set(ratelimitdPodLabels(t, r))) ||
					len(selected(r, deploytest.MustSelector(t, "from", p.PodSelector))) != 1 {
					t.Errorf("NetworkPolicy %s: Redis ingress peer %+v is not exactly ratelimitd", np.Name, p)
				}
			}
		}
	}
	if !guarded {
		t.Errorf("no ingress NetworkPolicy guards Redis")
	}
}

// testProductionOverlay checks overlays/production: its Redis wiring and
// the egress NetworkPolicy to Redis.
func testProductionOverlay(t *testing.T) {
	r := render(t, "overlays/production")
	_, c := ratelimitd(t, r)
	if got := envValue(c, "RATELIMITD_BACKEND"); got != "redis" {
		t.Errorf("RATELIMITD_BACKEND = %q, want redis", got)
	}
	mode := envValue(c, "RATELIMITD_REDIS_MODE")
	if mode != "cluster" && mode != "sentinel" {
		t.Errorf("RATELIMITD_REDIS_MODE = %q, want cluster or sentinel", mode)
	}
	addrs := strings.Split(envValue(c, "RATELIMITD_REDIS_ADDRS"), ",")
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			t.Errorf("RATELIMITD_REDIS_ADDRS item %q: %v", a, err)
		}
	}
	if mode == "sentinel" && envValue(c, "RATELIMITD_REDIS_MASTER") == "" {
		t.Errorf("sentinel mode needs RATELIMITD_REDIS_MASTER")
	}
	raw := envValue(c, "RATELIMITD_REDIS_URL")
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "rediss" {
		t.Errorf("RATELIMITD_REDIS_URL = %q: production Redis must use TLS (rediss://) (%v)", raw, err)
	}
	// The password is a file of a mounted Secret (--redis-password-file),
	// never part of the URL or of the environment.
	if u != nil && u.User != nil {
		if _, set := u.User.Password(); set {
			t.Errorf("RATELIMITD_REDIS_URL carries a password; use RATELIMITD_REDIS_PASSWORD_FILE")
		}
	}
	d, _ := ratelimitd(t, r)
	for _, f := range []string{"RATELIMITD_REDIS_PASSWORD_FILE", "RATELIMITD_REDIS_TLS_CA"} {
		deploytest.CheckSecretFile(t, d, c, f, envValue(c, f))
	}
	if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":") {
		t.Errorf("production image %q must be pinned", c.Image)
	}
	// Egress to Redis is allowed, on the ports of the seed nodes.
	ports := map[string]bool{}
	for _, a := range addrs {
		_, p, _ := net.SplitHostPort(a)
		ports[p] = false
	}
	for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
		for _, eg := range np.Spec.Egress {
			for _, p := range eg.Ports {
				if _, ok := ports[p.Port.String()]; ok {
					ports[p.Port.String()] = true
				}
			}
		}
	}
	for p, ok := range ports {
		if !ok {
			t.Errorf("no NetworkPolicy allows egress to Redis port %s", p)
		}
	}
}

// TestMemoryStoreSingleReplica: the in-memory store counts per pod, so a
// workload on it runs exactly one replica with no HPA (N replicas would
// multiply every limit by up to N); every other workload shares Redis.
func TestMemoryStoreSingleReplica(t *testing.T) {
	for _, dir := range workloads {
		r := render(t, dir)
		t.Run(dir, func(t *testing.T) {
			d, c := ratelimitd(t, r)
			backend := envValue(c, "RATELIMITD_BACKEND")
			hpas := byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler")
			switch backend {
			case "memory":
				if dir != "overlays/dev" {
					t.Errorf("backend memory outside the dev overlay")
				}
				if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
					t.Errorf("memory store with replicas %v, want 1", d.Spec.Replicas)
				}
				if len(hpas) != 0 {
					t.Errorf("memory store with %d HorizontalPodAutoscalers, want none", len(hpas))
				}
				for _, e := range c.Env {
					if strings.HasPrefix(e.Name, "RATELIMITD_REDIS_") {
						t.Errorf("memory store, yet %s is set", e.Name)
					}
				}
			case "redis":
				if len(hpas) != 1 || hpas[0].Spec.MinReplicas == nil || *hpas[0].Spec.MinReplicas < 2 {
					t.Errorf("redis backend: want one HPA with minReplicas >= 2, got %d", len(hpas))
				}
			default:
				t.Errorf("RATELIMITD_BACKEND = %q, want redis (or memory in overlays/dev)", backend)
			}
		})
	}
	if _, c := ratelimitd(t, render(t, "base")); envValue(c, "RATELIMITD_BACKEND") != "redis" {
		t.Errorf("the base must run on Redis")
	}
}

// TestOverlayDurable checks overlays/durable: the durable store's URL
// comes from a Secret key (never a value in the manifest), the password
// file is that Secret's key mounted where RATELIMITD_DURABLE_PASSWORD_FILE
// points, and a NetworkPolicy lets ratelimitd reach PostgreSQL.
func TestOverlayDurable(t *testing.T) {
	r := render(t, "overlays/durable")
	d, c := ratelimitd(t, r)
	var secret string
	for _, e := range c.Env {
		if e.Name != "RATELIMITD_DURABLE_URL" {
			continue
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Fatalf("RATELIMITD_DURABLE_URL = %+v, want from a Secret key", e)
		}
		secret = e.ValueFrom.SecretKeyRef.Name
	}
	if secret == "" {
		t.Fatal("no RATELIMITD_DURABLE_URL")
	}
	pw := envValue(c, "RATELIMITD_DURABLE_PASSWORD_FILE")
	if pw == "" {
		t.Fatal("no RATELIMITD_DURABLE_PASSWORD_FILE")
	}
	deploytest.CheckSecretFile(t, d, c, "RATELIMITD_DURABLE_PASSWORD_FILE", pw)
	var fromSecret string
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(pw, m.MountPath+"/") {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil {
					fromSecret = v.Secret.SecretName
				}
			}
		}
	}
	if fromSecret != secret {
		t.Errorf("the password file is from Secret %q, the URL from %q: want one Secret", fromSecret, secret)
	}
	var egress bool
	for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
		if !deploytest.MustSelector(t, "np", &np.Spec.PodSelector).Matches(labels.Set(ratelimitdPodLabels(t, r))) {
			continue
		}
		for _, e := range np.Spec.Egress {
			for _, p := range e.Ports {
				if p.Port != nil && p.Port.IntValue() == 5432 && len(e.To) > 0 {
					egress = true
				}
			}
		}
	}
	if !egress {
		t.Error("no NetworkPolicy lets ratelimitd reach PostgreSQL (5432)")
	}
}
