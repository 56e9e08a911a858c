package k8s_test

import (
	"bytes"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// The kustomizations a user applies.
var entryPoints = []string{"base", "overlays/redis", "overlays/production", "overlays/dev", "istio"}

// The workload overlays (ratelimitd itself).
var workloads = []string{"base", "overlays/redis", "overlays/production", "overlays/dev"}

// The overlays, each built on ../../base.
var overlays = []string{"overlays/redis", "overlays/production", "overlays/dev"}

// Contract defaults of `ratelimitd serve` (README.md, flags), used when a
// manifest does not set the flag's environment twin.
var serveDefaults = map[string]string{
	"RATELIMITD_GRPC_ADDR":       ":8081",
	"RATELIMITD_HTTP_ADDR":       ":8080",
	"RATELIMITD_DEBUG_ADDR":      "127.0.0.1:6070",
	"RATELIMITD_IGNORE_DOTFILES": "true",
	"RATELIMITD_METRICS_ADDR":    "",
	"RATELIMITD_DRAIN":           "0s",
	"RATELIMITD_SHUTDOWN_GRACE":  "15s",
	"RATELIMITD_BACKEND":         "memory",
}

// HTTP paths ratelimitd serves on its HTTP address (README.md).
var httpPaths = []string{"/healthcheck", "/json", "/metrics"}

// gRPC health service names ratelimitd reports (README.md).
var grpcHealthServices = []string{"", "envoy.service.ratelimit.v3.RateLimitService"}

// TestEveryManifestDecodesStrictly decodes every YAML file under k8s/
// (except rate-limit config files) with the Kubernetes API types.
func TestEveryManifestDecodesStrictly(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "config" {
			return filepath.SkipDir // ratelimitd config, checked by policy.Load
		}
		if d.IsDir() || (!strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml")) {
			return nil
		}
		objs, err := decodeFile(p)
		if err != nil {
			t.Error(err)
			return nil
		}
		if len(objs) == 0 {
			t.Errorf("%s: no document", p)
		}
		n += len(objs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 15 {
		t.Errorf("decoded only %d documents; the walk missed files", n)
	}
}

// TestStrictDecoderRejects proves the decoder is strict: a misspelt or
// misplaced field, a duplicate key, a wrong type and an unknown kind all
// fail.
func TestStrictDecoderRejects(t *testing.T) {
	for name, doc := range deploytest.RejectedDocs {
		if _, _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestKustomizeLayout checks every entry point renders: each listed file
// exists, overlays build on the base, and names are unique per kind.
func TestKustomizeLayout(t *testing.T) {
	for _, dir := range entryPoints {
		r := render(t, dir)
		seen := map[string]bool{}
		for _, o := range r.Objects {
			id := o.Kind + " " + metaOf(o.Obj).Namespace + "/" + o.Name
			if seen[id] {
				t.Errorf("%s: %s rendered twice", dir, id)
			}
			seen[id] = true
		}
	}
	for _, dir := range overlays {
		objs, err := decodeFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if k := objs[0].Obj.(*kustomization); !slices.Contains(k.Resources, "../../base") {
			t.Errorf("%s does not build on ../../base: resources %v", dir, k.Resources)
		}
	}
	// Every manifest file is a resource or a patch of some kustomization.
	used := map[string]bool{}
	for _, dir := range entryPoints {
		objs, err := decodeFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		k := objs[0].Obj.(*kustomization)
		for _, res := range k.Resources {
			used[filepath.Join(dir, res)] = true
		}
		for _, p := range k.Patches {
			if p.Path != "" {
				used[filepath.Join(dir, p.Path)] = true
			}
		}
	}
	filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		if d.IsDir() && d.Name() == "config" {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, ".yaml") && filepath.Base(p) != "kustomization.yaml" && !used[p] {
			t.Errorf("%s is listed in no kustomization.yaml", p)
		}
		return nil
	})
}

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

func byName[T any](r rendered, gvk, name string) []*T {
	var out []*T
	for _, o := range r.Objects {
		if o.Kind == gvk && o.Name == name {
			out = append(out, o.Obj.(*T))
		}
	}
	return out
}

// ratelimitd returns the ratelimitd Deployment and its container.
func ratelimitd(t *testing.T, r rendered) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	ds := byName[appsv1.Deployment](r, "apps/v1/Deployment", "ratelimitd")
	if len(ds) != 1 {
		t.Fatalf("%s: %d Deployments named ratelimitd", r.Dir, len(ds))
	}
	for i, c := range ds[0].Spec.Template.Spec.Containers {
		if c.Name == "ratelimitd" {
			return ds[0], &ds[0].Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("%s: no container named ratelimitd", r.Dir)
	return nil, nil
}

// envValue returns a container's literal env value, else the serve default.
func envValue(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return serveDefaults[name]
}

// TestRatelimitdPodSpec checks the Deployment of every workload overlay:
// probes on the ports ratelimitd really listens on, hardening, resources,
// replicas, graceful termination and the config volume.
func TestRatelimitdPodSpec(t *testing.T) {
	for _, dir := range workloads {
		r := render(t, dir)
		t.Run(dir, func(t *testing.T) {
			d, c := ratelimitd(t, r)
			pt := podTemplate{"Deployment ratelimitd", &d.Spec.Template}
			grpcPort := deploytest.AddrPort(t, "RATELIMITD_GRPC_ADDR", envValue(c, "RATELIMITD_GRPC_ADDR"))
			httpPort := deploytest.AddrPort(t, "RATELIMITD_HTTP_ADDR", envValue(c, "RATELIMITD_HTTP_ADDR"))
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

			// Probes.
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
					if p.HTTPGet.Path != "/healthcheck" {
						t.Errorf("%s probe: path %q, want /healthcheck", name, p.HTTPGet.Path)
					}
					if !slices.Contains(httpPaths, p.HTTPGet.Path) {
						t.Errorf("%s probe: ratelimitd serves no %q", name, p.HTTPGet.Path)
					}
				default:
					t.Errorf("%s probe: want grpc or httpGet", name)
				}
			}
			if !sawHTTP {
				t.Errorf("no probe checks HTTP /healthcheck")
			}

			// Hardening.
			ps := d.Spec.Template.Spec.SecurityContext
			sc := c.SecurityContext
			switch {
			case ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot:
				t.Errorf("pod: runAsNonRoot must be true")
			case ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Errorf("pod: seccompProfile must be RuntimeDefault")
			case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("container: readOnlyRootFilesystem must be true")
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("container: allowPrivilegeEscalation must be false")
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("container: capabilities must drop ALL and add none")
			}
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

			// Graceful termination longer than the drain.
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

			// Config: a ConfigMap mounted as a directory, which --config names.
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
		})
	}
}

// configPaths returns the --config values of a container (args or env).
func configPaths(c *corev1.Container) []string {
	var out []string
	for i, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			out = append(out, strings.Split(strings.TrimPrefix(a, "--config="), ",")...)
		case a == "--config" && i+1 < len(c.Args):
			out = append(out, strings.Split(c.Args[i+1], ",")...)
		}
	}
	if v := envValue(c, "RATELIMITD_CONFIG"); v != "" {
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}

// TestConfigMapConfigLoads runs ratelimitd's own loader over the rendered
// ConfigMap, laid out as the kubelet lays it out (files are symlinks into
// a ..<timestamp> directory behind a ..data symlink), with the options the
// Deployment sets.
func TestConfigMapConfigLoads(t *testing.T) {
	r := render(t, "base")
	cm := byName[corev1.ConfigMap](r, "v1/ConfigMap", "ratelimitd-config")
	if len(cm) != 1 {
		t.Fatalf("no ConfigMap ratelimitd-config")
	}
	if len(cm[0].Data) == 0 {
		t.Fatalf("ConfigMap ratelimitd-config is empty")
	}
	dir := deploytest.KubeletVolume(t, cm[0].Data)
	set, warnings, err := policy.Load(policy.LoadOptions{IgnoreDotFiles: true}, dir)
	if err != nil {
		t.Fatalf("policy.Load(ConfigMap as mounted): %v", err)
	}
	for _, w := range warnings {
		t.Logf("%s", w)
	}
	if len(set.Domains()) == 0 {
		t.Errorf("config loads no domain")
	}
}

// TestConfigMatchesExample keeps the ConfigMap's files equal to the shipped
// example config (examples/config): what is deployed is what is
// documented and tested elsewhere.
func TestConfigMatchesExample(t *testing.T) {
	ex := filepath.Join("..", "examples", "config")
	if _, err := os.Stat(ex); err != nil {
		t.Fatalf("examples/config: %v", err)
	}
	mine := yamlFiles(t, filepath.Join("base", "config"))
	theirs := yamlFiles(t, ex)
	for name, b := range theirs {
		if m, ok := mine[name]; !ok {
			t.Errorf("examples/config/%s is missing from k8s/base/config (copy it and list it in base/kustomization.yaml)", name)
		} else if !bytes.Equal(m, b) {
			t.Errorf("k8s/base/config/%s differs from examples/config/%s", name, name)
		}
	}
	for name := range mine {
		if _, ok := theirs[name]; !ok {
			t.Errorf("k8s/base/config/%s is not in examples/config", name)
		}
	}
}

func yamlFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = b
		}
	}
	return out
}

// TestOverlayRedis checks each overlay's Redis wiring.
func TestOverlayRedis(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
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
	})
	t.Run("production", func(t *testing.T) {
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
	})
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

// TestValidateCommand runs `ratelimitd validate` on the ConfigMap's files,
// as the issue asks ("the ConfigMap's config passes ratelimitd validate").
func TestValidateCommand(t *testing.T) {
	bin := buildRatelimitd(t)
	out, err := runCmd(bin, "validate", filepath.Join("base", "config"))
	if err != nil {
		t.Fatalf("ratelimitd validate base/config: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644)
	if out, err := runCmd(bin, "validate", bad); err == nil {
		t.Errorf("ratelimitd validate accepted a bad unit:\n%s", out)
	}
}
