// The ratelimitd container of every workload: flags and their environment
// twins, probes, ports, resources and hardening.

package k8s_test

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// HTTP paths ratelimitd serves on its HTTP address (docs/flags.md).
var httpPaths = []string{"/healthcheck", "/livez", "/json", "/metrics"}

// gRPC health service names ratelimitd reports.
var grpcHealthServices = []string{"", "envoy.service.ratelimit.v3.RateLimitService"}

// TestRatelimitdPodSpec checks the Deployment of every workload overlay:
// probes on the ports ratelimitd really listens on, hardening, resources,
// replicas, graceful termination and the config volume.
func TestRatelimitdPodSpec(t *testing.T) {
	for _, dir := range workloads {
		r := render(t, dir)
		t.Run(dir, func(t *testing.T) {
			d, c := ratelimitd(t, r)
			pt := podTemplate{"Deployment ratelimitd", &d.Spec.Template}
			grpcPort, httpPort := checkPodListeners(t, pt, c)
			checkPodProbes(t, pt, c, grpcPort, httpPort)
			checkPodResources(t, d, c)
			checkPodTermination(t, d, c)
			checkPodConfigMount(t, r, d, c)
		})
	}
}

// checkPodListeners: the container ports are the ports ratelimitd
// listens on, under the same names, and the debug listener stays on
// loopback. It returns the gRPC and HTTP ports.
func checkPodListeners(t *testing.T, pt podTemplate, c *corev1.Container) (grpcPort, httpPort int32) {
	t.Helper()
	grpcPort = deploytest.AddrPort(t, "RATELIMITD_GRPC_ADDR", envValue(c, "RATELIMITD_GRPC_ADDR"))
	httpPort = deploytest.AddrPort(t, "RATELIMITD_HTTP_ADDR", envValue(c, "RATELIMITD_HTTP_ADDR"))
	listening := map[int32]string{grpcPort: "grpc", httpPort: "http"}
	if m := envValue(c, "RATELIMITD_METRICS_ADDR"); m != "" {
		listening[deploytest.AddrPort(t, "RATELIMITD_METRICS_ADDR", m)] = "metrics"
	}
	if dbg := envValue(c, "RATELIMITD_DEBUG_ADDR"); dbg != "" {
		if h, _, _ := net.SplitHostPort(dbg); h != "127.0.0.1" && h != "localhost" {
			t.Errorf("debug address %q (pprof) is reachable from the network; bind it to 127.0.0.1", dbg)
		}
	}
	for _, cp := range c.Ports {
		if name, ok := listening[cp.ContainerPort]; !ok || name != cp.Name {
			t.Errorf("container port %s/%d: ratelimitd listens there as %q (want the same name)", cp.Name, cp.ContainerPort, name)
		}
	}
	if p, ok := containerPort(pt, "grpc"); !ok || p != grpcPort {
		t.Errorf("container port grpc = %d, ratelimitd's gRPC port is %d", p, grpcPort)
	}
	return grpcPort, httpPort
}

// checkPodProbes: readiness is the gRPC health of the RateLimitService;
// every probe asks a port and a service or path ratelimitd serves, and one
// GETs /healthcheck.
func checkPodProbes(t *testing.T, pt podTemplate, c *corev1.Container, grpcPort, httpPort int32) {
	t.Helper()
	if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.StartupProbe == nil {
		t.Fatalf("want startup, readiness and liveness probes")
	}
	if g := c.ReadinessProbe.GRPC; g == nil || g.Service == nil || *g.Service != "envoy.service.ratelimit.v3.RateLimitService" {
		t.Errorf("readiness must be the gRPC health check of envoy.service.ratelimit.v3.RateLimitService, got %+v", c.ReadinessProbe.ProbeHandler)
	}
	sawHTTP := false
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		switch {
		case p.GRPC != nil:
			if p.GRPC.Port != grpcPort {
				t.Errorf("%s probe: gRPC port %d, ratelimitd serves gRPC on %d", name, p.GRPC.Port, grpcPort)
			}
			if p.GRPC.Service != nil && !slices.Contains(grpcHealthServices, *p.GRPC.Service) {
				t.Errorf("%s probe: gRPC health service %q is not one ratelimitd reports", name, *p.GRPC.Service)
			}
		case p.HTTPGet != nil:
			sawHTTP = true
			port, ok := containerPort(pt, p.HTTPGet.Port.String())
			if !ok || port != httpPort {
				t.Errorf("%s probe: HTTP port %s (%d) is not ratelimitd's HTTP port %d", name, p.HTTPGet.Port.String(), port, httpPort)
			}
			if !slices.Contains(httpPaths, p.HTTPGet.Path) {
				t.Errorf("%s probe: ratelimitd serves no %q", name, p.HTTPGet.Path)
			}
		default:
			t.Errorf("%s probe: want grpc or httpGet", name)
		}
	}
	if !sawHTTP {
		t.Errorf("no probe checks HTTP")
	}
	// Liveness and startup must not depend on the config: /healthcheck and
	// the gRPC health are NOT_SERVING until a good config loads, and a pod
	// restarted for a bad ConfigMap only restarts again.
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe} {
		if p.HTTPGet == nil || p.HTTPGet.Path != "/livez" {
			t.Errorf("%s probe: want GET /livez (answers whenever the process does), got %+v", name, p.ProbeHandler)
		}
	}
}

// checkPodResources: hardening (deploytest.CheckHardening), CPU and
// memory requests, a memory limit, the replica count for the backend and
// a topology spread.
func checkPodResources(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	deploytest.CheckHardening(t, d, c)
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			t.Errorf("no %s request", res)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("no memory limit")
	}
	wantReplicas := int32(3)
	if envValue(c, "RATELIMITD_BACKEND") == "memory" {
		wantReplicas = 1 // TestMemoryStoreSingleReplica
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != wantReplicas {
		t.Errorf("replicas = %v, want %d", d.Spec.Replicas, wantReplicas)
	}
	if len(d.Spec.Template.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("no topologySpreadConstraints")
	}
}

// checkPodTermination: a drain, and a termination grace period longer
// than drain + shutdown grace.
func checkPodTermination(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	drain, err1 := time.ParseDuration(envValue(c, "RATELIMITD_DRAIN"))
	grace, err2 := time.ParseDuration(envValue(c, "RATELIMITD_SHUTDOWN_GRACE"))
	if err1 != nil || err2 != nil {
		t.Fatalf("drain/shutdown-grace: %v %v", err1, err2)
	}
	if drain <= 0 {
		t.Errorf("RATELIMITD_DRAIN = %s: without a drain, endpoints that have not yet seen the pod go away get refused connections", drain)
	}
	tgp := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if tgp == nil || time.Duration(*tgp)*time.Second <= drain+grace {
		t.Errorf("terminationGracePeriodSeconds %v must exceed drain %s + shutdown grace %s", tgp, drain, grace)
	}
}

// checkPodConfigMount: a ConfigMap rendered here, mounted as a directory
// (no subPath, no items) that --config names, with dot files ignored.
func checkPodConfigMount(t *testing.T, r rendered, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	var cfgVol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			cfgVol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if cfgVol == nil {
		t.Fatalf("no ConfigMap volume")
	}
	if len(byName[corev1.ConfigMap](r, "v1/ConfigMap", cfgVol.ConfigMap.Name)) != 1 {
		t.Errorf("volume %s: ConfigMap %q is not rendered here", cfgVol.Name, cfgVol.ConfigMap.Name)
	}
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.Name == cfgVol.Name {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("ConfigMap volume %s is not mounted", cfgVol.Name)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Errorf("config mount uses subPath: the kubelet never updates subPath mounts, so hot reload would not see edits")
	}
	if len(cfgVol.ConfigMap.Items) > 0 {
		t.Errorf("config volume lists items: new files added to the ConfigMap would not appear")
	}
	configArgs := configPaths(c)
	if !slices.Contains(configArgs, mount.MountPath) {
		t.Errorf("--config %v does not name the mounted directory %s", configArgs, mount.MountPath)
	}
	if envValue(c, "RATELIMITD_IGNORE_DOTFILES") != "true" {
		t.Errorf("RATELIMITD_IGNORE_DOTFILES must be true: the ConfigMap directory holds ..data and ..<timestamp> copies of every file")
	}
}

// TestEnvNamesAreFlags: every RATELIMITD_* variable in the manifests is the
// twin of a real `ratelimitd serve` flag (from the built binary's -h).
func TestEnvNamesAreFlags(t *testing.T) {
	bin := buildRatelimitd(t)
	flags := serveFlags(t, bin)
	for _, dir := range workloads {
		_, c := ratelimitd(t, render(t, dir))
		for _, e := range c.Env {
			if !strings.HasPrefix(e.Name, "RATELIMITD_") {
				continue
			}
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e.Name, "RATELIMITD_"), "_", "-"))
			if !flags[flag] {
				t.Errorf("%s: %s is no serve flag's twin (no --%s)", dir, e.Name, flag)
			}
		}
		for _, a := range c.Args {
			if name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); strings.HasPrefix(a, "--") && !flags[name] {
				t.Errorf("%s: arg %s is no serve flag", dir, a)
			}
		}
	}
}
