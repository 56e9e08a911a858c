package archtest

import (
	"strings"
	"testing"
)

// testOnly lists modules that only tests may import: the Helm chart and
// kustomize renderers and the Prometheus Operator types (deploy/helm,
// k8s). They are heavy; the ratelimitd binary must not link them.
var testOnly = []string{
	"helm.sh/",
	"sigs.k8s.io/kustomize/",
	"github.com/prometheus-operator/",
	"k8s.io/client-go",
}

// TestBinaryLinksNoTestOnlyModule: cmd/ratelimitd depends on no test-only
// module.
func TestBinaryLinksNoTestOnlyModule(t *testing.T) {
	for _, d := range deps(t, "cmd/ratelimitd") {
		for _, m := range testOnly {
			if strings.HasPrefix(d, m) {
				t.Errorf("cmd/ratelimitd depends on %s, a test-only module", d)
			}
		}
	}
}
