package deploy_test

import (
	"os"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"gopkg.in/yaml.v3"
)

// podTemplate is what the scrape configs select on in k8s/base's
// Deployment: the namespace, the pod labels and the container ports.
type podTemplate struct {
	namespace string
	labels    map[string]string
	ports     []string
	container string
}

func readPodTemplate(t *testing.T) podTemplate {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Metadata struct {
					Labels map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec struct {
					Containers []struct {
						Name  string `yaml:"name"`
						Ports []struct {
							Name string `yaml:"name"`
						} `yaml:"ports"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	readYAML(t, "../k8s/base/deployment.yaml", &d)
	var k struct {
		Namespace string `yaml:"namespace"`
	}
	readYAML(t, "../k8s/base/kustomization.yaml", &k)
	c := d.Spec.Template.Spec.Containers
	if len(c) != 1 || k.Namespace == "" {
		t.Fatalf("k8s/base: %d containers, namespace %q", len(c), k.Namespace)
	}
	p := podTemplate{namespace: k.Namespace, labels: d.Spec.Template.Metadata.Labels, container: c[0].Name}
	for _, port := range c[0].Ports {
		p.ports = append(p.ports, port.Name)
	}
	return p
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// The shipped scrape config parses as Prometheus' relabel rules and,
// applied to the targets Kubernetes pod discovery yields for k8s/base's
// pods, keeps exactly the metrics port of ratelimitd pods and attaches the
// namespace and pod labels the alerts and dashboard group by.
func TestScrapeConfig(t *testing.T) {
	var sc struct {
		ScrapeConfigs []struct {
			JobName     string `yaml:"job_name"`
			MetricsPath string `yaml:"metrics_path"`
			SD          []struct {
				Role       string `yaml:"role"`
				Namespaces struct {
					Names []string `yaml:"names"`
				} `yaml:"namespaces"`
			} `yaml:"kubernetes_sd_configs"`
			Relabel []*relabel.Config `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/scrape.yaml", &sc)
	if len(sc.ScrapeConfigs) != 1 {
		t.Fatalf("%d scrape configs, want 1", len(sc.ScrapeConfigs))
	}
	job := sc.ScrapeConfigs[0]
	pod := readPodTemplate(t)
	if job.JobName == "" || job.MetricsPath != "/metrics" || len(job.SD) != 1 || job.SD[0].Role != "pod" ||
		!slices.Equal(job.SD[0].Namespaces.Names, []string{pod.namespace}) {
		t.Errorf("job %q path %q discovery %+v; want pod discovery in namespace %q, /metrics", job.JobName, job.MetricsPath, job.SD, pod.namespace)
	}
	for _, r := range job.Relabel {
		if err := r.Validate(model.UTF8Validation); err != nil {
			t.Fatalf("relabel %+v: %v", r, err)
		}
	}
	if !slices.Contains(pod.ports, "metrics") {
		t.Fatalf("k8s/base pod ports %v: no port named metrics", pod.ports)
	}
	// One target per container port, with the meta labels of pod
	// discovery.
	target := func(podLabels map[string]string, port string) labels.Labels {
		m := map[string]string{
			"__address__":                               "10.0.0.5:1",
			"__meta_kubernetes_namespace":               pod.namespace,
			"__meta_kubernetes_pod_name":                "ratelimitd-5d9c7-abcde",
			"__meta_kubernetes_pod_container_name":      pod.container,
			"__meta_kubernetes_pod_container_port_name": port,
		}
		for k, v := range podLabels {
			m["__meta_kubernetes_pod_label_"+k] = v
		}
		// Kubernetes discovery sanitizes label names: . / - become _.
		lb := labels.NewBuilder(labels.EmptyLabels())
		for k, v := range m {
			lb.Set(sanitize(k), v)
		}
		return lb.Labels()
	}
	for _, port := range pod.ports {
		lb := labels.NewBuilder(target(pod.labels, port))
		keep := relabel.ProcessBuilder(lb, job.Relabel...)
		if keep != (port == "metrics") {
			t.Errorf("ratelimitd pod, port %s: kept %v", port, keep)
			continue
		}
		if keep {
			got := lb.Labels()
			if got.Get("namespace") != pod.namespace || got.Get("pod") != "ratelimitd-5d9c7-abcde" || got.Get("container") != pod.container {
				t.Errorf("kept target labels %v: want namespace, pod and container", got)
			}
		}
	}
	other := map[string]string{"app.kubernetes.io/name": "redis"}
	if relabel.ProcessBuilder(labels.NewBuilder(target(other, "metrics")), job.Relabel...) {
		t.Error("a pod of another app with a metrics port is scraped")
	}
}

// sanitize is Kubernetes discovery's label name rule (strutil.SanitizeLabelName).
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', i > 0 && c >= '0' && c <= '9':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// The PodMonitor selects k8s/base's pods in their namespace on the port
// named metrics.
func TestPodMonitor(t *testing.T) {
	var pm struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			NamespaceSelector struct {
				MatchNames []string `yaml:"matchNames"`
			} `yaml:"namespaceSelector"`
			Endpoints []struct {
				Port string `yaml:"port"`
				Path string `yaml:"path"`
			} `yaml:"podMetricsEndpoints"`
		} `yaml:"spec"`
	}
	readYAML(t, "prometheus/podmonitor.yaml", &pm)
	pod := readPodTemplate(t)
	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Kind != "PodMonitor" {
		t.Errorf("%s %s, want monitoring.coreos.com/v1 PodMonitor", pm.APIVersion, pm.Kind)
	}
	if len(pm.Spec.Selector.MatchLabels) == 0 {
		t.Error("empty selector")
	}
	for k, v := range pm.Spec.Selector.MatchLabels {
		if pod.labels[k] != v {
			t.Errorf("selector %s=%s does not select k8s/base's pods (labels %v)", k, v, pod.labels)
		}
	}
	if !slices.Equal(pm.Spec.NamespaceSelector.MatchNames, []string{pod.namespace}) {
		t.Errorf("namespaces %v, want [%s]", pm.Spec.NamespaceSelector.MatchNames, pod.namespace)
	}
	if len(pm.Spec.Endpoints) != 1 || pm.Spec.Endpoints[0].Port != "metrics" || pm.Spec.Endpoints[0].Path != "/metrics" ||
		!slices.Contains(pod.ports, "metrics") {
		t.Errorf("endpoints %+v, pod ports %v: want the port named metrics, /metrics", pm.Spec.Endpoints, pod.ports)
	}
}
