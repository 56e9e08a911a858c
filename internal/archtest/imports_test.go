// Package archtest enforces the import direction of the layout:
// algo <- policy <- service <- cmd, and algo <- backends <- cmd.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/ratelimitd/ratelimitd/"

// forbidden lists, per package (non-test code), module packages it must
// not depend on, directly or transitively.
var forbidden = map[string][]string{
	"pkg/algo":   {"pkg/"}, // stdlib only (checked separately below)
	"pkg/policy": {"pkg/service", "pkg/backend", "cmd/"},
	// pkg/policy/xds delivers configs over xDS into pkg/policy; its
	// xdstest (a management server for tests) likewise.
	"pkg/policy/xds":         {"pkg/service", "pkg/backend", "cmd/"},
	"pkg/policy/xds/xdstest": {"pkg/service", "pkg/backend", "cmd/", "pkg/policy/xds"},
	"pkg/service":            {"pkg/backend", "cmd/"},
	"pkg/backend/memory":     {"pkg/service", "pkg/policy", "pkg/backend/redis", "pkg/backend/memcache", "cmd/"},
	"pkg/backend/redis":      {"pkg/service", "pkg/policy", "pkg/backend/memory", "pkg/backend/memcache", "cmd/"},
	"pkg/backend/memcache":   {"pkg/service", "pkg/policy", "pkg/backend/memory", "pkg/backend/redis", "cmd/"},
	// pkg/backend/overlimit is the local over-limit cache the Redis and
	// memcached stores share: it depends on pkg/algo only.
	"pkg/backend/overlimit": {"pkg/service", "pkg/policy", "pkg/backend/memory", "pkg/backend/redis", "pkg/backend/memcache", "cmd/"},
	"pkg/algo/algotest":     {"pkg/service", "pkg/policy", "pkg/backend", "cmd/"},
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../../"+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

func TestImportDirection(t *testing.T) {
	for pkg, bad := range forbidden {
		for _, d := range deps(t, pkg) {
			if d == mod+pkg {
				continue
			}
			if pkg == "pkg/algo" {
				t.Errorf("%s must import the standard library only, imports %s", pkg, d)
				continue
			}
			for _, b := range bad {
				if strings.HasPrefix(d, mod+b) {
					t.Errorf("%s must not depend on %s (via %s)", pkg, b, d)
				}
			}
		}
	}
}
