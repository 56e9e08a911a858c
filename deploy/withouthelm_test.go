package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// docs/kubernetes.md's "Without Helm" installs with kubectl alone: no helm
// command, every kustomize directory and file it names exists, and its
// PrometheusRule pipeline, run by sh from the repository root, yields a
// PrometheusRule holding exactly the alerting rules file.
func TestDocsWithoutHelm(t *testing.T) {
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n### Without Helm\n")
	if !ok {
		t.Fatal(`docs/kubernetes.md has no "### Without Helm" section`)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	var script strings.Builder
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(sec, -1) {
		script.WriteString(m[1])
	}
	cmds := script.String()
	if cmds == "" {
		t.Fatal("the section has no sh block")
	}
	if regexp.MustCompile(`(?m)^\s*helm\b|\|\s*helm\b`).MatchString(cmds) {
		t.Errorf("the section without Helm runs helm:\n%s", cmds)
	}
	root := ".."
	applied := 0
	for _, m := range regexp.MustCompile(`kubectl apply -k (\S+)`).FindAllStringSubmatch(cmds, -1) {
		applied++
		if _, err := os.Stat(filepath.Join(root, m[1], "kustomization.yaml")); err != nil {
			t.Errorf("kubectl apply -k %s: %v", m[1], err)
		}
	}
	if applied == 0 {
		t.Errorf("the section applies no kustomize overlay")
	}
	files := 0
	for _, m := range regexp.MustCompile(`(?:-f |--from-file=|sed '[^']*' )(deploy/[^\s;]+)`).FindAllStringSubmatch(cmds, -1) {
		f := m[1]
		files++
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	if files < 3 {
		t.Errorf("the section names %d repository files; want the PodMonitor, the rules and the dashboard", files)
	}

	pipe := regexp.MustCompile(`(?s)\{ printf .*?; \} \| kubectl apply -f -`).FindString(cmds)
	if pipe == "" {
		t.Fatalf("no PrometheusRule pipeline in:\n%s", cmds)
	}
	cmd := exec.Command("sh", "-c", strings.TrimSuffix(pipe, "| kubectl apply -f -"))
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", pipe, err)
	}
	var pr monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict(out, &pr); err != nil {
		t.Fatalf("the pipeline's output is no PrometheusRule: %v\n%s", err, out)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Namespace != "ratelimitd" || pr.Labels["release"] == "" {
		t.Errorf("%s %s %s/%s labels %v", pr.APIVersion, pr.Kind, pr.Namespace, pr.Name, pr.Labels)
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Groups) == 0 {
		t.Fatalf("%s holds no group", rulesFile)
	}
	if d := cmp.Diff(file.Groups, pr.Spec.Groups); d != "" {
		t.Errorf("PrometheusRule differs from %s (-file +rule):\n%s", rulesFile, d)
	}
}
