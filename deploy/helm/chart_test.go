package helm_test

import (
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// combos are the documented value combinations (values.yaml,
// docs/kubernetes.md): each must render, decode strictly, and pass the
// checks every release must pass (TestEveryComboIsSound).
var combos = map[string]string{
	"default":    ``,
	"memory dev": "backend: memory\n",
	"hpa off":    "autoscaling: {enabled: false}\nreplicaCount: 4\n",
	"existing secret": `
redis:
  url: redis://ratelimitd@redis-master.cache:6379/0
  existingSecret: redis-credentials
  existingSecretPasswordKey: redis-password
`,
	"cluster": `
redis:
  mode: cluster
  url: rediss://ratelimitd@redis-0.cache.example.internal:6380/0
  addrs: [redis-0.cache.example.internal:6380, redis-1.cache.example.internal:6380, redis-2.cache.example.internal:6380]
  existingSecret: ratelimitd-redis
  tls: {enabled: true}
`,
	"sentinel": `
redis:
  mode: sentinel
  url: redis://ratelimitd@unused:6379/2
  addrs: [sentinel-0.cache:26379, sentinel-1.cache:26379, sentinel-2.cache:26379]
  master: mymaster
  existingSecret: ratelimitd-redis
  sentinelAuth: {existingSecret: ratelimitd-sentinel, key: auth}
`,
	"tls": `
redis:
  url: rediss://ratelimitd@redis.cache.example.internal:6380/0
  existingSecret: ratelimitd-redis
  tls:
    enabled: true
    existingSecret: ratelimitd-redis-tls
    caKey: ca.crt
    certKey: tls.crt
    keyKey: tls.key
`,
	"service monitor": `
serviceMonitor: {enabled: true, namespace: monitoring, labels: {release: kube-prometheus-stack}, interval: 15s}
prometheusRule: {enabled: true}
dashboard: {enabled: true}
`,
	"pod monitor": `
podMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
`,
	"custom rule namespace and labels": `
prometheusRule:
  enabled: true
  namespace: monitoring
  labels: {release: kube-prometheus-stack, team: edge}
  additionalRuleLabels: {team: edge, severity: page}
`,
	"network policy": `
networkPolicy:
  enabled: true
  redisEgress:
    - to: [{ipBlock: {cidr: 10.64.0.0/20}}]
      ports: [{port: 6380, protocol: TCP}]
`,
	"existing config map":   "config: {existingConfigMap: my-rules}\n",
	"config as yaml object": "config:\n  files:\n    edge.yaml:\n      domain: edge\n      descriptors:\n        - key: tenant\n          rate_limit: {unit: second, requests_per_unit: 10}\n",
	"extra args and env": `
extraArgs: ["--headers=both", "--redis-pool-size=32", "--local-cache-size=10000"]
extraEnv:
  - {name: RATELIMITD_NEAR_LIMIT_RATIO, value: "0.9"}
  - {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: "otel-collector.observability:4317"}
`,
	"metrics on the http port": "metrics: {enabled: false}\n",
}

// TestEveryComboIsSound renders every combination and checks what every
// release must hold: selectors select the pods, named ports exist, probes
// hit ratelimitd's real ports and /healthcheck, --config names the mounted
// ConfigMap directory, the debug listener stays on loopback, no secret in
// args or env, hardening, and a replica count that is safe for the backend.
func TestEveryComboIsSound(t *testing.T) {
	for name, values := range combos {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			checkRelease(t, r)
		})
	}
}

func checkRelease(t *testing.T, r release) {
	t.Helper()
	d, c := deployment(t, r)
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel := deploytest.MustSelector(t, "Deployment", d.Spec.Selector)
	if !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", d.Spec.Selector.MatchLabels, podLabels)
	}
	for _, o := range r.Objects {
		if m := metaOf(o.Obj); m.Namespace == "" {
			t.Errorf("%s: no namespace (helm install -n would still apply it, kubectl apply of helm template output would not)", o)
		}
	}

	// Listen addresses and ports.
	grpcPort := deploytest.AddrPort(t, "--grpc-addr", mustArg(t, c, "grpc-addr"))
	httpPort := deploytest.AddrPort(t, "--http-addr", mustArg(t, c, "http-addr"))
	listening := map[string]int32{"grpc": grpcPort, "http": httpPort}
	if m, ok := arg(t, c, "metrics-addr"); ok {
		listening["metrics"] = deploytest.AddrPort(t, "--metrics-addr", m)
	}
	if len(c.Ports) != len(listening) {
		t.Errorf("container ports %v, ratelimitd listens on %v", c.Ports, listening)
	}
	for _, p := range c.Ports {
		if listening[p.Name] != p.ContainerPort {
			t.Errorf("container port %s/%d: ratelimitd listens there as %v", p.Name, p.ContainerPort, listening)
		}
	}
	if dbg, ok := arg(t, c, "debug-addr"); ok && dbg != "" {
		if h, _, err := net.SplitHostPort(dbg); err != nil || !net.ParseIP(h).IsLoopback() {
			t.Errorf("--debug-addr=%s: pprof and /rlconfig must stay on loopback", dbg)
		}
	}

	// Probes.
	if c.StartupProbe == nil || c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Fatalf("want startup, readiness and liveness probes")
	}
	if g := c.ReadinessProbe.GRPC; g == nil || g.Port != grpcPort || g.Service == nil || *g.Service != "envoy.service.ratelimit.v3.RateLimitService" {
		t.Errorf("readiness: want the gRPC health of envoy.service.ratelimit.v3.RateLimitService on %d, got %+v", grpcPort, c.ReadinessProbe.ProbeHandler)
	}
	if g := c.StartupProbe.GRPC; g == nil || g.Port != grpcPort {
		t.Errorf("startup: want gRPC health on %d, got %+v", grpcPort, c.StartupProbe.ProbeHandler)
	}
	if h := c.LivenessProbe.HTTPGet; h == nil || h.Path != "/healthcheck" || deploytest.ContainerPort(c, h.Port.String()) != httpPort {
		t.Errorf("liveness: want GET /healthcheck on the http port %d, got %+v", httpPort, c.LivenessProbe.ProbeHandler)
	}

	// Graceful termination exceeds drain + shutdown grace.
	drain, err1 := time.ParseDuration(mustArg(t, c, "drain"))
	grace, err2 := time.ParseDuration(mustArg(t, c, "shutdown-grace"))
	if err1 != nil || err2 != nil {
		t.Fatalf("--drain/--shutdown-grace: %v %v", err1, err2)
	}
	if tgp := d.Spec.Template.Spec.TerminationGracePeriodSeconds; tgp == nil || time.Duration(*tgp)*time.Second <= drain+grace {
		t.Errorf("terminationGracePeriodSeconds %v must exceed --drain %s + --shutdown-grace %s", tgp, drain, grace)
	}

	// Config: --config names the directory the ConfigMap is mounted at.
	checkConfigMount(t, r, d, c)

	// Secrets only as files: no password in args, env or the URL.
	for _, a := range c.Args {
		if strings.Contains(a, "password=") || strings.HasPrefix(a, "--redis-sentinel-auth=") {
			t.Errorf("arg %q passes a secret on the command line", a)
		}
	}
	for _, e := range c.Env {
		if e.Name == "RATELIMITD_REDIS_SENTINEL_AUTH" || strings.Contains(e.Name, "PASSWORD") && !strings.HasSuffix(e.Name, "_FILE") {
			t.Errorf("env %s passes a secret in the environment", e.Name)
		}
	}
	if u, ok := arg(t, c, "redis-url"); ok {
		pu, err := url.Parse(u)
		if err != nil {
			t.Errorf("--redis-url=%s: %v", u, err)
		} else if _, set := pu.User.Password(); set {
			t.Errorf("--redis-url carries a password")
		}
	}
	for _, f := range []string{"redis-password-file", "redis-sentinel-auth-file", "redis-tls-ca", "redis-tls-cert", "redis-tls-key"} {
		if p, ok := arg(t, c, f); ok {
			deploytest.CheckSecretFile(t, d, c, "--"+f, p)
		}
	}

	// Hardening.
	ps, sc := d.Spec.Template.Spec.SecurityContext, c.SecurityContext
	switch {
	case ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot:
		t.Errorf("pod: runAsNonRoot must be true")
	case ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("pod: seccompProfile must be RuntimeDefault")
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("container: readOnlyRootFilesystem must be true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("container: allowPrivilegeEscalation must be false")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("container: capabilities must drop ALL")
	}
	if sa := d.Spec.Template.Spec.AutomountServiceAccountToken; sa == nil || *sa {
		t.Errorf("the pod mounts a service-account token; ratelimitd calls no Kubernetes API")
	}

	// Backend and replicas.
	hpas := byKind[autoscalingv2.HorizontalPodAutoscaler](r, "autoscaling/v2/HorizontalPodAutoscaler")
	switch b := mustArg(t, c, "backend"); b {
	case "memory":
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("backend memory with replicas %v: each pod counts alone, want exactly 1", d.Spec.Replicas)
		}
		if len(hpas) != 0 {
			t.Errorf("backend memory with an HPA: a second pod multiplies every limit")
		}
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--redis-") {
				t.Errorf("backend memory, yet %s", a)
			}
		}
		if !strings.Contains(r.Notes, "WARNING: backend memory") {
			t.Errorf("NOTES.txt does not warn about the memory backend:\n%s", r.Notes)
		}
	case "redis":
		if strings.Contains(r.Notes, "WARNING") {
			t.Errorf("NOTES.txt warns with backend redis:\n%s", r.Notes)
		}
		if len(hpas) == 1 && d.Spec.Replicas != nil {
			t.Errorf("with an HPA the Deployment must not set replicas (an upgrade would reset the HPA's count)")
		}
	default:
		t.Errorf("--backend=%s: want redis or memory", b)
	}
	for _, h := range hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
			t.Errorf("HPA %s targets %+v, not Deployment %s", h.Name, ref, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("HPA %s: min %v max %d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
	}
	for _, p := range byKind[policyv1.PodDisruptionBudget](r, "policy/v1/PodDisruptionBudget") {
		if !deploytest.MustSelector(t, "PDB", p.Spec.Selector).Matches(podLabels) {
			t.Errorf("PDB %s selects other pods", p.Name)
		}
	}
	for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
		if !deploytest.MustSelector(t, "topologySpread", tsc.LabelSelector).Matches(podLabels) {
			t.Errorf("topologySpreadConstraint %s selects other pods", tsc.TopologyKey)
		}
	}

	// Service: selects the pods, every target port is a container port.
	svc := one[corev1.Service](t, r, "v1/Service")
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not match the pods", svc.Spec.Selector)
	}
	for _, p := range svc.Spec.Ports {
		if deploytest.ContainerPort(c, p.TargetPort.String()) == 0 {
			t.Errorf("Service port %s: targetPort %s is no container port", p.Name, p.TargetPort.String())
		}
		if p.Name == "grpc" && (p.AppProtocol == nil || *p.AppProtocol != "grpc") {
			t.Errorf("Service port grpc needs appProtocol grpc (per-request balancing in meshes)")
		}
	}
	if sa := d.Spec.Template.Spec.ServiceAccountName; len(byKind[corev1.ServiceAccount](r, "v1/ServiceAccount")) == 1 && one[corev1.ServiceAccount](t, r, "v1/ServiceAccount").Name != sa {
		t.Errorf("pod runs as %q, the chart creates another ServiceAccount", sa)
	}

	// NetworkPolicy: selects the pods, ports exist.
	for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
		if !deploytest.MustSelector(t, "NetworkPolicy", &np.Spec.PodSelector).Matches(podLabels) {
			t.Errorf("NetworkPolicy %s selects other pods", np.Name)
		}
		for _, in := range np.Spec.Ingress {
			if len(in.From) == 0 {
				t.Errorf("NetworkPolicy %s admits every source", np.Name)
			}
			for _, p := range in.Ports {
				if deploytest.ContainerPort(c, p.Port.String()) == 0 {
					t.Errorf("NetworkPolicy %s: ingress port %s is no container port", np.Name, p.Port.String())
				}
			}
		}
	}

	// Monitors scrape the metrics port of these pods.
	for _, sm := range byKind[monitoringv1.ServiceMonitor](r, "monitoring.coreos.com/v1/ServiceMonitor") {
		if !deploytest.MustSelector(t, "ServiceMonitor", &sm.Spec.Selector).Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v does not match the Service labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		if sm.Namespace != svc.Namespace && !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) {
			t.Errorf("ServiceMonitor in %s does not look into the Service's namespace %s", sm.Namespace, svc.Namespace)
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port != "metrics" || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("ServiceMonitor endpoint port %q is not the Service's metrics port", ep.Port)
			}
			if ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor path %q", ep.Path)
			}
		}
	}
	for _, pm := range byKind[monitoringv1.PodMonitor](r, "monitoring.coreos.com/v1/PodMonitor") {
		if !deploytest.MustSelector(t, "PodMonitor", &pm.Spec.Selector).Matches(podLabels) {
			t.Errorf("PodMonitor selector does not match the pods")
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil || *ep.Port != "metrics" || deploytest.ContainerPort(c, *ep.Port) == 0 {
				t.Errorf("PodMonitor endpoint port %v is not the metrics container port", ep.Port)
			}
		}
	}
}

// checkConfigMount: --config names the directory a ConfigMap volume is
// mounted at, without subPath or items (either would hide edits from the
// hot reload); a rendered ConfigMap loads with ratelimitd's own loader,
// laid out as the kubelet lays it out.
func checkConfigMount(t *testing.T, r release, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	cfg := mustArg(t, c, "config")
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == cfg {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("--config=%s is no mount path of the container", cfg)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" || !mount.ReadOnly {
		t.Errorf("config mount: want read-only, no subPath (the kubelet never updates subPath mounts)")
	}
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.ConfigMap == nil {
		t.Fatalf("--config=%s: volume %s is no ConfigMap", cfg, mount.Name)
	}
	if len(vol.ConfigMap.Items) > 0 {
		t.Errorf("config volume lists items: files added later would not appear")
	}
	if v, ok := arg(t, c, "ignore-dotfiles"); ok && v != "true" {
		t.Errorf("--ignore-dotfiles=%s: the ConfigMap directory holds ..data copies of every file", v)
	}
	var cm *corev1.ConfigMap
	for _, m := range byKind[corev1.ConfigMap](r, "v1/ConfigMap") {
		if m.Name == vol.ConfigMap.Name {
			cm = m
		}
	}
	if cm == nil {
		return // config.existingConfigMap: the user's own (TestExistingConfigMap)
	}
	if len(cm.Data) == 0 {
		t.Fatalf("ConfigMap %s is empty", cm.Name)
	}
	dir := deploytest.KubeletVolume(t, cm.Data)
	set, _, err := policy.Load(policy.LoadOptions{IgnoreDotFiles: true}, dir)
	if err != nil {
		t.Fatalf("policy.Load(ConfigMap %s as mounted): %v", cm.Name, err)
	}
	if len(set.Domains()) == 0 {
		t.Errorf("ConfigMap %s loads no domain", cm.Name)
	}
}

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

// TestDefaults: the default install runs on Redis, 3 to 12 replicas under
// an HPA, debug on loopback, the appVersion image, no optional objects.
func TestDefaults(t *testing.T) {
	r := render(t, "")
	d, c := deployment(t, r)
	if got := mustArg(t, c, "backend"); got != "redis" {
		t.Errorf("--backend=%s, want redis by default", got)
	}
	if got := mustArg(t, c, "redis-url"); got != "redis://redis:6379/0" {
		t.Errorf("--redis-url=%s", got)
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
		"apps/v1/Deployment": 1, "v1/Service": 1, "v1/ServiceAccount": 1, "v1/ConfigMap": 1,
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
}

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
			// values.schema.json: a misspelt or misplaced key is an error.
			"replicas: 3\n":                                                  "additional properties 'replicas'",
			"redis: {password: hunter2}\n":                                   "additional properties 'password'",
			"serviceMonitor: {enabled: true, intervall: 10s}\n":              "additional properties 'intervall'",
			"extraArgs: [redis-pool-size=3]\n":                               "/extraArgs/0",
			"drain: 5\n":                                                     "/drain",
			"redis: {mode: cluster}\n":                                       "needs redis.addrs",
			"redis: {mode: sentinel, addrs: ['s:26379']}\n":                  "needs redis.master",
			"redis: {addrs: ['a:6379']}\n":                                   "standalone",
			"redis: {tls: {enabled: true}}\n":                                "rediss://",
			"redis: {tls: {existingSecret: ca}}\n":                           "need redis.tls.enabled",
			"redis: {sentinelAuth: {existingSecret: s}}\n":                   "sentinel",
			"serviceMonitor: {enabled: true}\npodMonitor: {enabled: true}\n": "choose one",
			"serviceMonitor: {enabled: true}\nmetrics: {enabled: false}\n":   "metrics.enabled",
			"config: {files: {ratelimitd.yaml: null}}\n":                     "needs a config",
			"config: {files: {'..data': 'domain: x'}}\n":                     "config.files key",
			"redis: {url: 'rediss://u@r:6380/0', tls: {enabled: true, existingSecret: s, certKey: tls.crt}}\n": "both",
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
		case v.Redis.ExistingSecret != "" && v.Backend != "memory":
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
		if svc := one[corev1.Service](t, r, "v1/Service"); svc.Name != c.want {
			t.Errorf("Service %s, want %s", svc.Name, c.want)
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
