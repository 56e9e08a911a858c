// The rate-limit config the manifests mount: it loads as mounted, matches
// the example, and passes ratelimitd validate.

package k8s_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

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

// TestValidateCommand runs `ratelimitd validate` on the ConfigMap's files:
// they pass, and a file with a bad unit does not.
func TestValidateCommand(t *testing.T) {
	bin := buildRatelimitd(t)
	out, err := runCmd(bin, "validate", filepath.Join("base", "config"))
	if err != nil {
		t.Fatalf("ratelimitd validate base/config: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCmd(bin, "validate", bad); err == nil {
		t.Errorf("ratelimitd validate accepted a bad unit:\n%s", out)
	}
}
