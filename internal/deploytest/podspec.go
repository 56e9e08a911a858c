package deploytest

import (
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// MustSelector is ls as a labels.Selector; t fails, naming what, when ls
// is nil or selects everything (no labels and no expressions), or is
// invalid.
func MustSelector(t testing.TB, what string, ls *metav1.LabelSelector) labels.Selector {
	t.Helper()
	if ls == nil || len(ls.MatchLabels)+len(ls.MatchExpressions) == 0 {
		t.Fatalf("%s: no selector, or an empty one", what)
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return s
}

// AddrPort is the port of a listen address "host:port" that what (a flag
// "--grpc-addr" or a variable) gives; t fails when addr has none.
func AddrPort(t testing.TB, what, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s=%q: %v", what, addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatalf("%s=%q: %v", what, addr, err)
	}
	return int32(n)
}

// CheckSecretFile checks that path, the value of what (a flag "--x" or a
// variable), is a file at the top of a Secret volume of d that c mounts
// read-only and without subPath (a subPath mount never sees a rotated
// Secret), and a key the volume projects.
func CheckSecretFile(t testing.TB, d *appsv1.Deployment, c *corev1.Container, what, path string) {
	t.Helper()
	if path == "" {
		t.Errorf("%s is not set", what)
		return
	}
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") || strings.Contains(rel, "/") {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil || v.Secret.SecretName == "" {
				t.Errorf("%s=%s: volume %s is no Secret", what, path, v.Name)
			} else if len(v.Secret.Items) > 0 && !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == rel }) {
				t.Errorf("%s=%s: Secret %s projects no key %s", what, path, v.Secret.SecretName, rel)
			}
			if !m.ReadOnly || m.SubPath != "" {
				t.Errorf("%s: mount %s must be read-only and without subPath", what, m.Name)
			}
			return
		}
	}
	t.Errorf("%s=%s is in no mounted Secret volume", what, path)
}

// CheckHardening checks the security contexts of d's pod and of c, the
// first rule broken failing t: the pod runs as non-root with the
// RuntimeDefault seccomp profile; c has a read-only root filesystem, no
// privilege escalation, and drops ALL capabilities and adds none.
func CheckHardening(t testing.TB, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
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
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("container: capabilities must drop ALL and add none")
	}
}

// ContainerPort resolves a named or numbered port p of c: its number, or
// 0 when c has no such port.
func ContainerPort(c *corev1.Container, p string) int32 {
	for _, cp := range c.Ports {
		if cp.Name == p || strconv.Itoa(int(cp.ContainerPort)) == p {
			return cp.ContainerPort
		}
	}
	return 0
}
