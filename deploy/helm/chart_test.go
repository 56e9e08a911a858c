package helm_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// secretOf returns the Secret name and key behind --flag's file.
func secretOf(t *testing.T, d *appsv1.Deployment, c *corev1.Container, flag string) (name, key string) {
	t.Helper()
	p := mustArg(t, c, flag)
	for _, m := range c.VolumeMounts {
		if filepath.Dir(p) != m.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				key = filepath.Base(p)
				for _, it := range v.Secret.Items {
					if it.Path == key {
						key = it.Key
					}
				}
				return v.Secret.SecretName, key
			}
		}
	}
	t.Fatalf("--%s=%s: in no Secret volume", flag, p)
	return "", ""
}

// TestDefaults: the default install runs on the chart's own Redis (a
// StatefulSet and its Service, which --redis-url names), 3 to 12 replicas
// under an HPA, debug on loopback, the appVersion image, no optional
// objects.
func TestDefaults(t *testing.T) {
	r := render(t, "")
	d, c := deployment(t, r)
	if got := mustArg(t, c, "backend"); got != "redis" {
		t.Errorf("--backend=%s, want redis by default", got)
	}
	if got := mustArg(t, c, "redis-url"); got != "redis://ratelimitd-redis.ratelimitd.svc:6379/0" {
		t.Errorf("--redis-url=%s, want the chart's Redis Service", got)
	}
	ss := one[appsv1.StatefulSet](t, r, "apps/v1/StatefulSet")
	if ss.Name != "ratelimitd-redis" || ss.Spec.ServiceName != "ratelimitd-redis" {
		t.Errorf("StatefulSet %s (service %s), want ratelimitd-redis", ss.Name, ss.Spec.ServiceName)
	}
	if got := mustArg(t, c, "debug-addr"); got != "127.0.0.1:6070" {
		t.Errorf("--debug-addr=%s, want 127.0.0.1:6070", got)
	}
	if _, ok := arg(t, c, "redis-password-file"); ok {
		t.Errorf("--redis-password-file without redis.existingSecret")
	}
	ch := loadChart(t)
	if want := "ghcr.io/ratelimitd/ratelimitd:" + ch.Metadata.AppVersion; c.Image != want {
		t.Errorf("image %s, want %s (tag = the chart's appVersion)", c.Image, want)
	}
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d set next to the HPA", *d.Spec.Replicas)
	}
	hpa := one[autoscalingv2.HorizontalPodAutoscaler](t, r, "autoscaling/v2/HorizontalPodAutoscaler")
	if *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("HPA %d-%d, want 3-12", *hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	if d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rollout must keep capacity: maxUnavailable 0")
	}
	kinds := map[string]int{}
	for _, o := range r.Objects {
		kinds[o.Kind]++
	}
	want := map[string]int{
		"apps/v1/Deployment": 1, "apps/v1/StatefulSet": 1, "v1/Service": 2, "v1/ServiceAccount": 1, "v1/ConfigMap": 1,
		"autoscaling/v2/HorizontalPodAutoscaler": 1, "policy/v1/PodDisruptionBudget": 1,
	}
	if d := cmp.Diff(want, kinds); d != "" {
		t.Errorf("default objects (-want +got):\n%s", d)
	}
	for _, o := range r.Objects {
		if m := metaOf(o.Obj); m.Namespace != "ratelimitd" || m.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s: namespace %q, labels %v", o, m.Namespace, m.Labels)
		}
	}
	if !strings.Contains(r.Notes, "ratelimitd.ratelimitd.svc.cluster.local:8081") {
		t.Errorf("NOTES.txt does not give the gRPC address:\n%s", r.Notes)
	}
	if !strings.Contains(r.Notes, "the chart's Redis") || !strings.Contains(r.Notes, "redis.enabled=false") {
		t.Errorf("NOTES.txt does not say the counters are in the chart's Redis and how to use your own:\n%s", r.Notes)
	}
}

// TestMemcacheBackend: backend memcache passes the servers (addresses or
// an SRV record) and no Redis flag, mounts no Redis Secret, runs no Redis,
// and the replicas share the counters (HPA as with Redis).
func TestMemcacheBackend(t *testing.T) {
	for name, want := range map[string][2]string{
		"memcache":     {"memcache-addrs", "memcached-0.cache:11211,memcached-1.cache:11211"},
		"memcache srv": {"memcache-srv", "_memcache._tcp.memcached.cache.svc.cluster.local"},
	} {
		r := render(t, combos[name]+"redis: {existingSecret: ignored}\n")
		d, c := deployment(t, r)
		if got := mustArg(t, c, "backend"); got != "memcache" {
			t.Errorf("%s: --backend=%s", name, got)
		}
		if got := mustArg(t, c, want[0]); got != want[1] {
			t.Errorf("%s: --%s=%s, want %s", name, want[0], got, want[1])
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				t.Errorf("%s: volume %s mounts a Redis Secret with backend memcache", name, v.Name)
			}
		}
		if n := len(byKind[appsv1.StatefulSet](r, "apps/v1/StatefulSet")); n != 0 {
			t.Errorf("%s: %d StatefulSets: the chart runs no Redis with backend memcache", name, n)
		}
		if n := len(byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler")); n != 1 {
			t.Errorf("%s: %d HPAs, want 1 (memcached is shared)", name, n)
		}
		if !strings.Contains(r.Notes, "memcached") {
			t.Errorf("%s: NOTES.txt:\n%s", name, r.Notes)
		}
	}
	if got := mustArg(t, must(deployment(t, render(t, combos["memcache"]))), "memcache-timeout"); got != "100ms" {
		t.Errorf("--memcache-timeout=%s", got)
	}
}

func must[A, B any](_ A, b B) B { return b }

// TestMemoryBackend: whatever replicaCount and autoscaling say, the memory
// store runs one pod, no HPA, no Redis flags, and the notes warn.
func TestMemoryBackend(t *testing.T) {
	r := render(t, "backend: memory\nreplicaCount: 5\nautoscaling: {enabled: true, minReplicas: 4}\nredis: {existingSecret: x}\n")
	d, c := deployment(t, r)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1", d.Spec.Replicas)
	}
	if n := len(byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler")); n != 0 {
		t.Errorf("%d HPAs with backend memory", n)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %s: a rolling update would run two pods counting side by side", d.Spec.Strategy.Type)
	}
	if mustArg(t, c, "backend") != "memory" {
		t.Errorf("--backend is not memory")
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			t.Errorf("volume %s mounts a Redis Secret with backend memory", v.Name)
		}
	}
	if !strings.Contains(r.Notes, "WARNING: backend memory") || !strings.Contains(r.Notes, "ONE replica") {
		t.Errorf("NOTES.txt:\n%s", r.Notes)
	}
}

// TestHPAOff: replicaCount is the count.
func TestHPAOff(t *testing.T) {
	r := render(t, combos["hpa off"])
	d, _ := deployment(t, r)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 4 {
		t.Errorf("replicas %v, want 4", d.Spec.Replicas)
	}
	if n := len(byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler")); n != 0 {
		t.Errorf("%d HPAs with autoscaling.enabled=false", n)
	}
}

// TestRedisTopologies: each topology becomes the right flags, the password
// comes from the named Secret's key as a file, never as a flag.
func TestRedisTopologies(t *testing.T) {
	t.Run("existing secret", func(t *testing.T) {
		d, c := deployment(t, render(t, combos["existing secret"]))
		if got := mustArg(t, c, "redis-mode"); got != "standalone" {
			t.Errorf("--redis-mode=%s", got)
		}
		if _, ok := arg(t, c, "redis-addrs"); ok {
			t.Errorf("--redis-addrs in standalone mode")
		}
		if s, k := secretOf(t, d, c, "redis-password-file"); s != "redis-credentials" || k != "redis-password" {
			t.Errorf("password file from Secret %s key %s, want redis-credentials/redis-password", s, k)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		d, c := deployment(t, render(t, combos["cluster"]))
		if got := mustArg(t, c, "redis-mode"); got != "cluster" {
			t.Errorf("--redis-mode=%s", got)
		}
		if got := strings.Split(mustArg(t, c, "redis-addrs"), ","); len(got) != 3 || got[1] != "redis-1.cache.example.internal:6380" {
			t.Errorf("--redis-addrs=%v", got)
		}
		if !strings.HasPrefix(mustArg(t, c, "redis-url"), "rediss://") {
			t.Errorf("TLS cluster without rediss://")
		}
		if s, _ := secretOf(t, d, c, "redis-password-file"); s != "ratelimitd-redis" {
			t.Errorf("password Secret %s", s)
		}
		if _, ok := arg(t, c, "redis-tls-ca"); ok {
			t.Errorf("--redis-tls-ca without redis.tls.existingSecret (system roots)")
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		d, c := deployment(t, render(t, combos["sentinel"]))
		if got := mustArg(t, c, "redis-mode"); got != "sentinel" {
			t.Errorf("--redis-mode=%s", got)
		}
		if got := mustArg(t, c, "redis-master"); got != "mymaster" {
			t.Errorf("--redis-master=%s", got)
		}
		if got := mustArg(t, c, "redis-addrs"); got != "sentinel-0.cache:26379,sentinel-1.cache:26379,sentinel-2.cache:26379" {
			t.Errorf("--redis-addrs=%s", got)
		}
		if s, k := secretOf(t, d, c, "redis-sentinel-auth-file"); s != "ratelimitd-sentinel" || k != "auth" {
			t.Errorf("sentinel auth from %s/%s", s, k)
		}
	})
	t.Run("tls", func(t *testing.T) {
		d, c := deployment(t, render(t, combos["tls"]))
		for flag, key := range map[string]string{"redis-tls-ca": "ca.crt", "redis-tls-cert": "tls.crt", "redis-tls-key": "tls.key"} {
			if s, k := secretOf(t, d, c, flag); s != "ratelimitd-redis-tls" || k != key {
				t.Errorf("--%s from %s/%s, want ratelimitd-redis-tls/%s", flag, s, k, key)
			}
		}
		if _, ok := arg(t, c, "redis-tls-skip-verify"); ok {
			t.Errorf("--redis-tls-skip-verify set by default")
		}
	})
	t.Run("refused", func(t *testing.T) {
		for values, want := range map[string]string{
			"backend: redis-cluster\n":                          "backend",
			"redis: {mode: replicated}\n":                       "/redis/mode",
			"redis: {url: 'redis://:hunter2@redis:6379/0'}\n":   "carries a password",
			"redis: {url: 'rediss://u:hunter2@redis:6379/0'}\n": "carries a password",
			"redis: {url: 'redis.example:6379'}\n":              "/redis/url",
			// The chart's Redis, or the user's: never a name nothing answers.
			"redis: {enabled: false}\n":                                           "needs redis.url",
			"redis: {url: 'redis://redis:6379/0'}\n":                              "set redis.enabled=false",
			"redis: {mode: cluster, addrs: ['a:6379']}\n":                         "deploys one standalone Redis",
			"redis: {existingSecret: s}\n":                                        "for your own Redis",
			"redis: {tls: {enabled: true}}\n":                                     "for your own Redis",
			"backend: memcache\n":                                                 "needs the memcached servers",
			"backend: memcache\nmemcache: {addrs: ['m:11211'], srv: _m._tcp.x}\n": "one of the two",
			"backend: memcache\nmemcache: {addrs: ['m']}\n":                       "/memcache/addrs/0",
			// values.schema.json: a misspelt or misplaced key is an error.
			"replicas: 3\n":                                                                         "additional properties 'replicas'",
			"redis: {password: hunter2}\n":                                                          "additional properties 'password'",
			"serviceMonitor: {enabled: true, intervall: 10s}\n":                                     "additional properties 'intervall'",
			"extraArgs: [redis-pool-size=3]\n":                                                      "/extraArgs/0",
			"drain: 5\n":                                                                            "/drain",
			"redis: {enabled: false, mode: cluster}\n":                                              "needs redis.addrs",
			"redis: {enabled: false, mode: sentinel, addrs: ['s:26379']}\n":                         "needs redis.master",
			"redis: {enabled: false, url: 'redis://r:6379/0', addrs: ['a:6379']}\n":                 "standalone",
			"redis: {enabled: false, url: 'redis://r:6379/0', tls: {enabled: true}}\n":              "rediss://",
			"redis: {enabled: false, url: 'redis://r:6379/0', tls: {existingSecret: ca}}\n":         "need redis.tls.enabled",
			"redis: {enabled: false, url: 'redis://r:6379/0', sentinelAuth: {existingSecret: s}}\n": "sentinel",
			"serviceMonitor: {enabled: true}\npodMonitor: {enabled: true}\n":                        "choose one",
			"serviceMonitor: {enabled: true}\nmetrics: {enabled: false}\n":                          "metrics.enabled",
			"config: {files: {ratelimitd.yaml: null}}\n":                                            "needs a config",
			"config: {files: {'..data': 'domain: x'}}\n":                                            "config.files key",
			"redis: {enabled: false, url: 'rediss://u@r:6380/0', tls: {enabled: true, existingSecret: s, certKey: tls.crt}}\n": "both",
		} {
			renderFails(t, values, want)
		}
	})
}

// TestPasswordNeverInline: a password reaches ratelimitd only through the
// Secret file: whenever redis.existingSecret is set, --redis-password-file
// names it, and the chart never renders a Secret of its own.
func TestPasswordNeverInline(t *testing.T) {
	for name, values := range combos {
		r := render(t, values)
		for _, o := range r.Objects {
			if o.Kind == "v1/Secret" {
				t.Errorf("%s: the chart renders Secret %s; it must only reference existing ones", name, o.Name)
			}
		}
		var v struct {
			Backend string `json:"backend"`
			Redis   struct {
				ExistingSecret string `json:"existingSecret"`
			} `json:"redis"`
		}
		if err := yaml.Unmarshal([]byte(values), &v); err != nil {
			t.Fatal(err)
		}
		d, c := deployment(t, r)
		_, ok := arg(t, c, "redis-password-file")
		switch {
		case v.Redis.ExistingSecret != "" && (v.Backend == "" || v.Backend == "redis"):
			if s, _ := secretOf(t, d, c, "redis-password-file"); s != v.Redis.ExistingSecret {
				t.Errorf("%s: password file from Secret %s, want %s", name, s, v.Redis.ExistingSecret)
			}
		case ok:
			t.Errorf("%s: --redis-password-file without redis.existingSecret", name)
		}
	}
}

// TestPrometheusRule: the rules are exactly files/alerts.rules.yaml (the
// file plain Prometheus loads), in the namespace and with the labels the
// values give; nothing hard-coded.
func TestPrometheusRule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatalf("files/alerts.rules.yaml: %v", err)
	}
	if len(file.Groups) == 0 || len(file.Groups[0].Rules) < 5 {
		t.Fatalf("files/alerts.rules.yaml holds %d groups", len(file.Groups))
	}

	t.Run("defaults", func(t *testing.T) {
		r := renderAs(t, "edge", "gateway", "prometheusRule: {enabled: true}\n")
		pr := one[monitoringv1.PrometheusRule](t, r, "monitoring.coreos.com/v1/PrometheusRule")
		if pr.Namespace != "gateway" {
			t.Errorf("namespace %s, want the release namespace gateway", pr.Namespace)
		}
		if _, ok := pr.Labels["release"]; ok {
			t.Errorf("labels %v: no release label unless prometheusRule.labels sets one", pr.Labels)
		}
		if pr.Name != "edge-ratelimitd" {
			t.Errorf("name %s", pr.Name)
		}
		if d := cmp.Diff(file.Groups, pr.Spec.Groups); d != "" {
			t.Errorf("PrometheusRule differs from files/alerts.rules.yaml (-file +rendered):\n%s", d)
		}
	})
	t.Run("custom namespace and labels", func(t *testing.T) {
		r := render(t, combos["custom rule namespace and labels"])
		pr := one[monitoringv1.PrometheusRule](t, r, "monitoring.coreos.com/v1/PrometheusRule")
		if pr.Namespace != "monitoring" {
			t.Errorf("namespace %s, want monitoring", pr.Namespace)
		}
		if pr.Labels["release"] != "kube-prometheus-stack" || pr.Labels["team"] != "edge" {
			t.Errorf("labels %v", pr.Labels)
		}
		// Every rule gets the additional labels; its own win (severity).
		want := file.Groups
		for gi := range want {
			for ri := range want[gi].Rules {
				r := &want[gi].Rules[ri]
				r.Labels = map[string]string{"team": "edge", "severity": r.Labels["severity"]}
			}
		}
		if d := cmp.Diff(want, pr.Spec.Groups); d != "" {
			t.Errorf("rules (-want +rendered):\n%s", d)
		}
	})
	t.Run("thresholds from values", func(t *testing.T) {
		// Every "# threshold: <name>" marker of the file has a value and
		// every value a marker.
		markers := map[string]bool{}
		for _, m := range regexp.MustCompile(`> [0-9.eE+-]+ # threshold: ([A-Za-z]+)`).FindAllStringSubmatch(string(b), -1) {
			markers[m[1]] = true
		}
		var values struct {
			PrometheusRule struct {
				Thresholds map[string]float64 `json:"thresholds"`
			} `json:"prometheusRule"`
		}
		vb, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(vb, &values); err != nil {
			t.Fatal(err)
		}
		for k := range values.PrometheusRule.Thresholds {
			if !markers[k] {
				t.Errorf("values prometheusRule.thresholds.%s: no \"# threshold: %s\" in files/alerts.rules.yaml", k, k)
			}
			delete(markers, k)
		}
		if len(markers) > 0 {
			t.Errorf("markers without a value in prometheusRule.thresholds: %v", markers)
		}
		r := render(t, "prometheusRule: {enabled: true, thresholds: {ruleDeniedShare: 0.25, earlyWarningsPerMinute: 3}}\n")
		pr := one[monitoringv1.PrometheusRule](t, r, "monitoring.coreos.com/v1/PrometheusRule")
		want := map[string][]string{
			"RatelimitdRuleSustainedDenials": {"> 0.25 # threshold: ruleDeniedShare", "> 0.1 # threshold: ruleMinRate"},
			"RatelimitdEarlyWarnings":        {"> 3 # threshold: earlyWarningsPerMinute"},
		}
		for gi, g := range pr.Spec.Groups {
			for ri, rule := range g.Rules {
				expr := rule.Expr.String()
				if ws, ok := want[rule.Alert]; ok {
					for _, w := range ws {
						if !strings.Contains(expr, w) {
							t.Errorf("%s: expr lacks %q:\n%s", rule.Alert, w, expr)
						}
					}
					delete(want, rule.Alert)
				} else if fe := file.Groups[gi].Rules[ri].Expr.String(); expr != fe {
					t.Errorf("%s changed by the thresholds:\n%s", rule.Alert, expr)
				}
			}
		}
		if len(want) > 0 {
			t.Errorf("alerts missing: %v", want)
		}
	})
	t.Run("off by default", func(t *testing.T) {
		if n := len(byKind[monitoringv1.PrometheusRule](render(t, ""), "monitoring.coreos.com/v1/PrometheusRule")); n != 0 {
			t.Errorf("%d PrometheusRules by default", n)
		}
	})
}

// TestMonitors: ServiceMonitor and PodMonitor are off by default and, when
// on, carry the selector labels of the user's Prometheus.
func TestMonitors(t *testing.T) {
	def := render(t, "")
	if n := len(byKind[monitoringv1.ServiceMonitor](def, "monitoring.coreos.com/v1/ServiceMonitor")) + len(byKind[monitoringv1.PodMonitor](def, "monitoring.coreos.com/v1/PodMonitor")); n != 0 {
		t.Errorf("%d monitors by default", n)
	}
	r := render(t, combos["service monitor"])
	sm := one[monitoringv1.ServiceMonitor](t, r, "monitoring.coreos.com/v1/ServiceMonitor")
	if sm.Namespace != "monitoring" || sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor %s/%s labels %v", sm.Namespace, sm.Name, sm.Labels)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"ratelimitd"}) {
		t.Errorf("namespaceSelector %v, want [ratelimitd]", sm.Spec.NamespaceSelector.MatchNames)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Interval != "15s" {
		t.Errorf("endpoints %+v", sm.Spec.Endpoints)
	}
	pr := render(t, combos["pod monitor"])
	pm := one[monitoringv1.PodMonitor](t, pr, "monitoring.coreos.com/v1/PodMonitor")
	if pm.Namespace != "ratelimitd" || pm.Labels["release"] != "kube-prometheus-stack" || pm.Spec.NamespaceSelector.MatchNames != nil {
		t.Errorf("PodMonitor %s labels %v selector %v", pm.Namespace, pm.Labels, pm.Spec.NamespaceSelector)
	}
}

// TestDashboard: the ConfigMap carries files/ratelimitd-dashboard.json
// byte for byte, with the sidecar's label.
func TestDashboard(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(chartDir, "files", "ratelimitd-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for values, label := range map[string][2]string{
		"dashboard: {enabled: true}\n": {"grafana_dashboard", "1"},
		"dashboard: {enabled: true, namespace: grafana, labels: {my_dashboards: 'yes'}, annotations: {grafana_folder: Envoy}}\n": {"my_dashboards", "yes"},
	} {
		r := render(t, values)
		var cm *corev1.ConfigMap
		for _, m := range byKind[corev1.ConfigMap](r, "v1/ConfigMap") {
			if strings.HasSuffix(m.Name, "-dashboard") {
				cm = m
			}
		}
		if cm == nil {
			t.Fatalf("%s: no dashboard ConfigMap", values)
		}
		if cm.Labels[label[0]] != label[1] {
			t.Errorf("%s: labels %v, want %s=%s", values, cm.Labels, label[0], label[1])
		}
		got := cm.Data["ratelimitd-dashboard.json"]
		if strings.TrimRight(got, "\n") != strings.TrimRight(string(want), "\n") {
			t.Errorf("%s: dashboard JSON differs from files/ratelimitd-dashboard.json", values)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("dashboard JSON is not valid")
		}
		if strings.Contains(values, "grafana") && (cm.Namespace != "grafana" || cm.Annotations["grafana_folder"] != "Envoy") {
			t.Errorf("namespace %s annotations %v", cm.Namespace, cm.Annotations)
		}
	}
}

// TestExistingConfigMap: no ConfigMap rendered; the volume names the
// user's.
func TestExistingConfigMap(t *testing.T) {
	r := render(t, combos["existing config map"])
	if n := len(byKind[corev1.ConfigMap](r, "v1/ConfigMap")); n != 0 {
		t.Errorf("%d ConfigMaps rendered next to config.existingConfigMap", n)
	}
	d, _ := deployment(t, r)
	if v := d.Spec.Template.Spec.Volumes[0]; v.ConfigMap == nil || v.ConfigMap.Name != "my-rules" {
		t.Errorf("config volume %+v, want ConfigMap my-rules", v)
	}
}

// TestNames: the full name follows the release; overrides win.
func TestNames(t *testing.T) {
	for _, c := range []struct{ release, values, want string }{
		{"ratelimitd", "", "ratelimitd"},
		{"edge", "", "edge-ratelimitd"},
		{"edge-ratelimitd-prod", "", "edge-ratelimitd-prod"},
		{"edge", "fullnameOverride: rl\n", "rl"},
		{"edge", "nameOverride: limiter\n", "edge-limiter"},
	} {
		r := renderAs(t, c.release, "ns", c.values)
		d, _ := deployment(t, r)
		if d.Name != c.want {
			t.Errorf("release %s values %q: Deployment %s, want %s", c.release, c.values, d.Name, c.want)
		}
		serviceNamed(t, r, c.want)
		if ss := one[appsv1.StatefulSet](t, r, "apps/v1/StatefulSet"); ss.Name != c.want+"-redis" {
			t.Errorf("Redis StatefulSet %s, want %s-redis", ss.Name, c.want)
		}
	}
}

// TestStrictDecoderRejects proves the decoder is strict: the shared cases
// and the Prometheus Operator kinds'.
func TestStrictDecoderRejects(t *testing.T) {
	docs := map[string]string{
		"monitor field":   "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  selector: {}\n  endpoint: []\n",
		"rule field":      "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec:\n  groups: [{name: g, rules: [{alert: A, expr: up, severity: x}]}]\n",
		"podmonitor port": "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec:\n  selector: {}\n  podMetricsEndpoints: [{port: metrics, targetPortt: 1}]\n",
	}
	maps.Copy(docs, deploytest.RejectedDocs)
	for name, doc := range docs {
		if _, _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestHelmLint runs `helm lint --strict`'s checks (Chart.yaml, values.yaml
// against values.schema.json, every template rendered and parsed as YAML,
// Kubernetes name and label rules) on the defaults and on every
// combination: no message of any severity.
func TestHelmLint(t *testing.T) {
	for name, values := range combos {
		vals, err := chartutil.ReadValues([]byte(values))
		if err != nil {
			t.Fatal(err)
		}
		res := lint.All(chartDir, vals.AsMap(), "ratelimitd", true)
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("%s: helm lint: %s", name, m)
			}
		}
	}
}

// TestDurableStore: durable.enabled gives ratelimitd its PostgreSQL URL
// through RATELIMITD_DURABLE_URL from the named Secret key (never a
// value in the manifest), the password file from its Secret key, and
// the async-commit and timeout flags; the NetworkPolicy lets it reach
// PostgreSQL. Off, nothing of it renders; on without the URL's Secret,
// or settings without enabled, the chart fails.
func TestDurableStore(t *testing.T) {
	r := render(t, combos["durable"])
	d, c := deployment(t, r)
	var ref *corev1.SecretKeySelector
	for _, e := range c.Env {
		if e.Name == "RATELIMITD_DURABLE_URL" {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Fatalf("RATELIMITD_DURABLE_URL = %+v, want from a Secret", e)
			}
			ref = e.ValueFrom.SecretKeyRef
		}
	}
	if ref == nil || ref.Name != "ratelimitd-durable" || ref.Key != "url" {
		t.Fatalf("durable URL from %+v, want Secret ratelimitd-durable key url", ref)
	}
	if s, k := secretOf(t, d, c, "durable-password-file"); s != "ratelimitd-pg" || k != "pg-password" {
		t.Errorf("--durable-password-file from Secret %s key %s, want ratelimitd-pg key pg-password", s, k)
	}
	for flag, want := range map[string]string{"durable-async-commit": "true", "durable-timeout": "50ms", "durable-connect-timeout": "10s"} {
		if v := mustArg(t, c, flag); v != want {
			t.Errorf("--%s=%s, want %s", flag, v, want)
		}
	}

	// The defaults of the rest: the key "url", no password file, no flags.
	r = render(t, combos["durable, memory, network policy, extra env"])
	_, c = deployment(t, r)
	names := map[string]bool{}
	for _, e := range c.Env {
		names[e.Name] = true
		if e.Name == "RATELIMITD_DURABLE_URL" && (e.ValueFrom.SecretKeyRef.Name != "quotas-db" || e.ValueFrom.SecretKeyRef.Key != "url") {
			t.Errorf("durable URL from %+v, want Secret quotas-db key url", e.ValueFrom.SecretKeyRef)
		}
	}
	if !names["RATELIMITD_DURABLE_URL"] || !names["RATELIMITD_NEAR_LIMIT_RATIO"] {
		t.Errorf("env %v: want the durable URL and extraEnv both", names)
	}
	for _, flag := range []string{"durable-password-file", "durable-async-commit", "durable-timeout", "durable-connect-timeout"} {
		if v, ok := arg(t, c, flag); ok {
			t.Errorf("--%s=%s without its value", flag, v)
		}
	}
	np := one[networkingv1.NetworkPolicy](t, r, "networking.k8s.io/v1/NetworkPolicy")
	found := false
	for _, e := range np.Spec.Egress {
		for _, p := range e.Ports {
			if p.Port != nil && p.Port.IntValue() == 5432 && len(e.To) == 1 && e.To[0].IPBlock != nil && e.To[0].IPBlock.CIDR == "10.80.0.0/24" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("NetworkPolicy egress %+v: no rule to PostgreSQL (durableEgress)", np.Spec.Egress)
	}

	// Off (the default): no durable env, flag or egress.
	r = render(t, "redis: {enabled: false, url: 'redis://redis.cache:6379/0'}\nnetworkPolicy: {enabled: true}\n")
	_, c = deployment(t, r)
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "RATELIMITD_DURABLE") {
			t.Errorf("durable off: env %s", e.Name)
		}
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--durable") {
			t.Errorf("durable off: arg %s", a)
		}
	}
	for _, e := range one[networkingv1.NetworkPolicy](t, r, "networking.k8s.io/v1/NetworkPolicy").Spec.Egress {
		for _, p := range e.Ports {
			if p.Port != nil && p.Port.IntValue() == 5432 {
				t.Errorf("durable off: egress to 5432")
			}
		}
	}

	renderFails(t, "durable: {enabled: true}\n", "durable.enabled needs durable.urlSecret.name")
	renderFails(t, "durable: {asyncCommit: true}\n", "need durable.enabled")
	renderFails(t, "durable: {enabled: true, url: 'postgres://u:pw@db/q'}\n", "url")
}
