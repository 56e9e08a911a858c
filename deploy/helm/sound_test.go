// What every release must hold (selectors, ports, probes, secrets,
// hardening, replicas, monitors), checked on every documented value
// combination.

package helm_test

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

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
  enabled: false
  url: redis://ratelimitd@redis-master.cache:6379/0
  existingSecret: redis-credentials
  existingSecretPasswordKey: redis-password
`,
	"cluster": `
redis:
  enabled: false
  mode: cluster
  url: rediss://ratelimitd@redis-0.cache.example.internal:6380/0
  addrs: [redis-0.cache.example.internal:6380, redis-1.cache.example.internal:6380, redis-2.cache.example.internal:6380]
  existingSecret: ratelimitd-redis
  tls: {enabled: true}
`,
	"sentinel": `
redis:
  enabled: false
  mode: sentinel
  url: redis://ratelimitd@unused:6379/2
  addrs: [sentinel-0.cache:26379, sentinel-1.cache:26379, sentinel-2.cache:26379]
  master: mymaster
  existingSecret: ratelimitd-redis
  sentinelAuth: {existingSecret: ratelimitd-sentinel, key: auth}
`,
	"tls": `
redis:
  enabled: false
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
	"own redis, no secret":     "redis: {enabled: false, url: 'redis://redis-master.cache:6379/0'}\n",
	"cluster without url":      "redis: {enabled: false, mode: cluster, addrs: ['redis-0.cache:6379', 'redis-1.cache:6379']}\n",
	"memcache":                 "backend: memcache\nmemcache: {addrs: ['memcached-0.cache:11211', 'memcached-1.cache:11211'], timeout: 100ms}\n",
	"memcache srv":             "backend: memcache\nmemcache: {srv: _memcache._tcp.memcached.cache.svc.cluster.local}\nnetworkPolicy: {enabled: true}\n",
	"durable": `
durable:
  enabled: true
  urlSecret: {name: ratelimitd-durable, key: url}
  passwordSecret: {name: ratelimitd-pg, key: pg-password}
  asyncCommit: true
  timeout: 50ms
  connectTimeout: 10s
`,
	"durable, memory, network policy, extra env": `
backend: memory
durable:
  enabled: true
  urlSecret: {name: quotas-db}
networkPolicy:
  enabled: true
  durableEgress:
    - to: [{ipBlock: {cidr: 10.80.0.0/24}}]
      ports: [{port: 5432, protocol: TCP}]
extraEnv:
  - {name: RATELIMITD_NEAR_LIMIT_RATIO, value: "0.9"}
`,
	"network policy, own redis": `
redis: {enabled: false, url: 'redis://10.64.0.7:6380/0'}
networkPolicy:
  enabled: true
  redisEgress:
    - to: [{ipBlock: {cidr: 10.64.0.0/20}}]
      ports: [{port: 6380, protocol: TCP}]
`,
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

// elsewhereByValue: the objects a value may put in another namespace (the
// monitoring stack's): monitors, the PrometheusRule and the dashboard.
func elsewhereByValue(o object) bool {
	switch o.Kind {
	case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule":
		return true
	}
	return o.Kind == "v1/ConfigMap" && strings.HasSuffix(o.Name, "-dashboard")
}

// checkRelease checks what every release must hold, one subject per check.
func checkRelease(t *testing.T, r release) {
	t.Helper()
	d, c := deployment(t, r)
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel := deploytest.MustSelector(t, "Deployment", d.Spec.Selector)
	if !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", d.Spec.Selector.MatchLabels, podLabels)
	}
	for _, o := range r.Objects {
		m := metaOf(o.Obj)
		switch {
		case m.Namespace == "":
			t.Errorf("%s: no namespace (helm install -n would still apply it, kubectl apply of helm template output would not)", o)
		case m.Namespace != r.Namespace && !elsewhereByValue(o):
			// ratelimitd names its Redis and reads its ConfigMap and
			// Secrets by short name: they resolve in its own namespace only.
			t.Errorf("%s: namespace %q, want the release namespace %q", o, m.Namespace, r.Namespace)
		}
	}

	grpcPort, httpPort := checkListeners(t, c)
	checkProbes(t, c, grpcPort, httpPort)
	checkTermination(t, d, c)
	checkConfigMount(t, r, d, c)
	checkSecretsAsFiles(t, d, c)
	checkHardening(t, d, c)
	checkBackendReplicas(t, r, d, c, podLabels)
	checkBundledRedis(t, r, c)
	svc := checkService(t, r, d, c, podLabels)
	checkNetworkPolicies(t, r, c, podLabels)
	checkMonitors(t, r, c, svc, podLabels)
}

// checkListeners: the container ports are the ports ratelimitd listens
// on (gRPC, HTTP, metrics when apart), and the debug listener stays on
// loopback. It returns the gRPC and HTTP ports.
func checkListeners(t *testing.T, c *corev1.Container) (grpcPort, httpPort int32) {
	t.Helper()
	grpcPort = deploytest.AddrPort(t, "--grpc-addr", mustArg(t, c, "grpc-addr"))
	httpPort = deploytest.AddrPort(t, "--http-addr", mustArg(t, c, "http-addr"))
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
	return grpcPort, httpPort
}

// checkProbes: startup and readiness ask the gRPC health of the
// RateLimitService, liveness GETs /healthcheck on the HTTP port.
func checkProbes(t *testing.T, c *corev1.Container, grpcPort, httpPort int32) {
	t.Helper()
	if c.StartupProbe == nil || c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Fatalf("want startup, readiness and liveness probes")
	}
	if g := c.ReadinessProbe.GRPC; g == nil || g.Port != grpcPort || g.Service == nil || *g.Service != "envoy.service.ratelimit.v3.RateLimitService" {
		t.Errorf("readiness: want the gRPC health of envoy.service.ratelimit.v3.RateLimitService on %d, got %+v", grpcPort, c.ReadinessProbe.ProbeHandler)
	}
	// Startup and liveness must not depend on the config (/healthcheck and
	// the gRPC health are NOT_SERVING until a good config loads): /livez
	// answers whenever the process does.
	if h := c.StartupProbe.HTTPGet; h == nil || h.Path != "/livez" || deploytest.ContainerPort(c, h.Port.String()) != httpPort {
		t.Errorf("startup: want GET /livez on the http port %d, got %+v", httpPort, c.StartupProbe.ProbeHandler)
	}
	if h := c.LivenessProbe.HTTPGet; h == nil || h.Path != "/livez" || deploytest.ContainerPort(c, h.Port.String()) != httpPort {
		t.Errorf("liveness: want GET /livez on the http port %d, got %+v", httpPort, c.LivenessProbe.ProbeHandler)
	}
}

// checkTermination: the graceful termination period exceeds --drain +
// --shutdown-grace.
func checkTermination(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	drain, err1 := time.ParseDuration(mustArg(t, c, "drain"))
	grace, err2 := time.ParseDuration(mustArg(t, c, "shutdown-grace"))
	if err1 != nil || err2 != nil {
		t.Fatalf("--drain/--shutdown-grace: %v %v", err1, err2)
	}
	if tgp := d.Spec.Template.Spec.TerminationGracePeriodSeconds; tgp == nil || time.Duration(*tgp)*time.Second <= drain+grace {
		t.Errorf("terminationGracePeriodSeconds %v must exceed --drain %s + --shutdown-grace %s", tgp, drain, grace)
	}
}

// checkSecretsAsFiles: secrets only as files, no password in args, env or
// the URL; every secret file flag names a mounted Secret key.
func checkSecretsAsFiles(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
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
	// The durable store's URL may hold a password: only from a Secret.
	if _, ok := arg(t, c, "durable-url"); ok {
		t.Errorf("--durable-url on the command line; it comes from a Secret")
	}
	for _, e := range c.Env {
		if e.Name == "RATELIMITD_DURABLE_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("env RATELIMITD_DURABLE_URL not from a Secret")
		}
	}
	for _, f := range []string{"redis-password-file", "redis-sentinel-auth-file", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "durable-password-file"} {
		if p, ok := arg(t, c, f); ok {
			deploytest.CheckSecretFile(t, d, c, "--"+f, p)
		}
	}
}

// checkHardening: deploytest.CheckHardening (non-root, RuntimeDefault
// seccomp, read-only root, no privilege escalation, no capabilities), and
// no service-account token.
func checkHardening(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	deploytest.CheckHardening(t, d, c)
	if sa := d.Spec.Template.Spec.AutomountServiceAccountToken; sa == nil || *sa {
		t.Errorf("the pod mounts a service-account token; ratelimitd calls no Kubernetes API")
	}
}

// checkBackendReplicas: a replica count safe for the backend (memory:
// exactly one pod, no HPA; redis: the HPA owns the count), and the HPA,
// PDB and topology spread target these pods.
func checkBackendReplicas(t *testing.T, r release, d *appsv1.Deployment, c *corev1.Container, podLabels labels.Set) {
	t.Helper()
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
	case "redis", "memcache":
		if strings.Contains(r.Notes, "WARNING") {
			t.Errorf("NOTES.txt warns with backend %s:\n%s", b, r.Notes)
		}
		if len(hpas) == 1 && d.Spec.Replicas != nil {
			t.Errorf("with an HPA the Deployment must not set replicas (an upgrade would reset the HPA's count)")
		}
		other := map[string]string{"redis": "--memcache-", "memcache": "--redis-"}[b]
		for _, a := range c.Args {
			if strings.HasPrefix(a, other) {
				t.Errorf("backend %s, yet %s", b, a)
			}
		}
		if _, addrs := arg(t, c, "memcache-addrs"); b == "memcache" {
			if _, srv := arg(t, c, "memcache-srv"); addrs == srv {
				t.Errorf("backend memcache needs exactly one of --memcache-addrs and --memcache-srv: %q", c.Args)
			}
		}
	default:
		t.Errorf("--backend=%s: want redis, memcache or memory", b)
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
}

// checkService: the Service selects the pods, every target port is a
// container port, gRPC has appProtocol grpc, and the pod runs as the
// chart's ServiceAccount. It returns the Service.
func checkService(t *testing.T, r release, d *appsv1.Deployment, c *corev1.Container, podLabels labels.Set) *corev1.Service {
	t.Helper()
	svc := serviceNamed(t, r, d.Name)
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
	return svc
}

// checkNetworkPolicies: each NetworkPolicy selects the pods, names its
// sources, and opens container ports only.
func checkNetworkPolicies(t *testing.T, r release, c *corev1.Container, podLabels labels.Set) {
	t.Helper()
	for _, np := range byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy") {
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] == "redis" {
			continue // the chart's Redis: checkBundledRedis
		}
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
}

// checkMonitors: ServiceMonitors and PodMonitors scrape /metrics on the
// metrics port of these pods.
func checkMonitors(t *testing.T, r release, c *corev1.Container, svc *corev1.Service, podLabels labels.Set) {
	t.Helper()
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

// serviceNamed returns the rendered Service called name.
func serviceNamed(t *testing.T, r release, name string) *corev1.Service {
	t.Helper()
	for _, s := range byKind[corev1.Service](r, "v1/Service") {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no Service %s", name)
	return nil
}

// checkBundledRedis: with backend redis, --redis-url reaches something.
// The chart's own Redis StatefulSet is reached through a rendered Service
// that selects exactly its pods and port; they run hardened, without
// persistence, with noeviction, and reachable by ratelimitd alone. Without
// the StatefulSet the URL names no Service of the release.
func checkBundledRedis(t *testing.T, r release, c *corev1.Container) {
	t.Helper()
	sts := byKind[appsv1.StatefulSet](r, "apps/v1/StatefulSet")
	u, hasURL := arg(t, c, "redis-url")
	if mustArg(t, c, "backend") != "redis" {
		if len(sts) != 0 || hasURL {
			t.Errorf("backend %s, yet a Redis StatefulSet (%d) or --redis-url", mustArg(t, c, "backend"), len(sts))
		}
		return
	}
	var host, port string
	if hasURL {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatalf("--redis-url=%s: %v", u, err)
		}
		host, port = pu.Hostname(), pu.Port()
	}
	if len(sts) == 0 {
		for _, s := range byKind[corev1.Service](r, "v1/Service") {
			if host == s.Name || strings.HasPrefix(host, s.Name+".") {
				t.Errorf("--redis-url=%s names the release's Service %s, which is not a Redis", u, s.Name)
			}
		}
		return
	}
	if len(sts) != 1 {
		t.Fatalf("%d StatefulSets", len(sts))
	}
	ss := sts[0]
	svc := serviceNamed(t, r, ss.Spec.ServiceName)
	if want := svc.Name + "." + svc.Namespace + ".svc"; host != want {
		t.Errorf("--redis-url host %q, want the chart's Redis Service %s", host, want)
	}
	podLabels := labels.Set(ss.Spec.Template.Labels)
	if !deploytest.MustSelector(t, "StatefulSet", ss.Spec.Selector).Matches(podLabels) {
		t.Errorf("StatefulSet selector does not match its pods")
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s selector %v does not match the Redis pods %v", svc.Name, svc.Spec.Selector, podLabels)
	}
	d := one[appsv1.Deployment](t, r, "apps/v1/Deployment")
	if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) ||
		deploytest.MustSelector(t, "Deployment", d.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Redis and ratelimitd pods share selectors")
	}
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 || len(ss.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the chart's Redis: want one pod of one container")
	}
	rc := &ss.Spec.Template.Spec.Containers[0]
	found := false
	for _, p := range svc.Spec.Ports {
		if fmt.Sprint(p.Port) == port && deploytest.ContainerPort(rc, p.TargetPort.String()) != 0 {
			found = true
			if got := deploytest.ContainerPort(rc, p.TargetPort.String()); fmt.Sprint(got) != redisArg(rc, "--port") {
				t.Errorf("Service port %d targets %d, redis-server listens on %s", p.Port, got, redisArg(rc, "--port"))
			}
		}
	}
	if !found {
		t.Errorf("Service %s has no port %s leading to the redis container", svc.Name, port)
	}
	if redisArg(rc, "--maxmemory-policy") != "noeviction" || redisArg(rc, "--save") != "" || redisArg(rc, "--appendonly") != "no" {
		t.Errorf("the chart's Redis args %q: want noeviction, no save, no AOF", rc.Args)
	}
	psc, sc := ss.Spec.Template.Spec.SecurityContext, rc.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("the chart's Redis is not hardened: %+v %+v", psc, sc)
	}
	if ss.Spec.Template.Spec.AutomountServiceAccountToken == nil || *ss.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Errorf("the chart's Redis mounts a service-account token")
	}
	nps := byKind[networkingv1.NetworkPolicy](r, "networking.k8s.io/v1/NetworkPolicy")
	if len(nps) == 0 {
		return
	}
	rlLabels := labels.Set(d.Spec.Template.Labels)
	var guarded, egress bool
	for _, np := range nps {
		sel := deploytest.MustSelector(t, "NetworkPolicy", &np.Spec.PodSelector)
		switch {
		case sel.Matches(podLabels):
			guarded = true
			for _, in := range np.Spec.Ingress {
				for _, f := range in.From {
					if f.PodSelector == nil || f.NamespaceSelector != nil || f.IPBlock != nil ||
						!deploytest.MustSelector(t, "from", f.PodSelector).Matches(rlLabels) {
						t.Errorf("NetworkPolicy %s admits more than ratelimitd's pods to Redis: %+v", np.Name, f)
					}
				}
			}
		case sel.Matches(rlLabels):
			for _, e := range np.Spec.Egress {
				for _, to := range e.To {
					if to.PodSelector != nil && deploytest.MustSelector(t, "to", to.PodSelector).Matches(podLabels) {
						egress = true
					}
				}
			}
		}
	}
	if !guarded || !egress {
		t.Errorf("NetworkPolicies: Redis guarded %v, ratelimitd may reach it %v", guarded, egress)
	}
}

// redisArg is the value after name in redis-server's args ("" if none).
func redisArg(c *corev1.Container, name string) string {
	for i, a := range c.Args {
		if a == name && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	return ""
}
