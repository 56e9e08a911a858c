package k8s_test

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

// The kustomizations a user applies.
var entryPoints = []string{"base", "overlays/redis", "overlays/production", "overlays/dev", "overlays/durable", "istio"}

// The workload overlays (ratelimitd itself).
var workloads = []string{"base", "overlays/redis", "overlays/production", "overlays/dev", "overlays/durable"}

// The overlays, each built on ../../base.
var overlays = []string{"overlays/redis", "overlays/production", "overlays/dev", "overlays/durable"}

// Defaults of `ratelimitd serve` (docs/flags.md), used when a manifest does
// not set the flag's environment twin.
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
