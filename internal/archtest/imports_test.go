// Package archtest holds the repository-level tests: the import direction
// of every package of the module (docs/architecture.md states it), test-only
// modules kept out of the binary, links and citations in the docs and
// comments that resolve inside the repository, and doc comments on
// exported identifiers.
package archtest

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const mod = "github.com/ratelimitd/ratelimitd/"

// mayImport maps every package of the module (its path below the module,
// or a "dir/..." pattern for a directory and everything under it) to the
// module packages its non-test code may import directly, as patterns of the
// same form. Packages outside the module are not constrained here (see
// testOnly). A package with no entry fails TestImportDirection: add it
// here, and its row to the package table of docs/architecture.md.
//
// Direct imports suffice: every package is listed, so what a package
// reaches transitively is what its allowed imports may reach. The layers:
// pkg/algo (stdlib only) <- pkg/policy <- pkg/service <- cmd, and
// pkg/algo <- backends <- cmd; the service never imports a backend, a
// backend never the service or pkg/policy; test fixtures (algotest,
// redistest, memcachetest, pgtest, xdstest) never reach the binary.
var mayImport = map[string][]string{
	"pkg/algo":                          {}, // and the standard library only: TestAlgoStdlibOnly
	"pkg/algo/algotest":                 {"pkg/algo"},
	"pkg/fairshare":                     {}, // and the standard library only: TestFairshareStdlibOnly
	"pkg/lease":                         {"pkg/algo", "pkg/fairshare", "pkg/opterr"},
	"pkg/policy":                        {"pkg/algo"},
	"pkg/policy/xds":                    {"pkg/algo", "pkg/policy", "pkg/opterr"},
	"pkg/policy/xds/xdstest":            {},
	"pkg/backend/overlimit":             {"pkg/algo", "pkg/backend/causes"},
	"pkg/backend/memory":                {"pkg/algo", "pkg/backend/stats"},
	"pkg/backend/stats":                 {},
	"pkg/backend/breaker":               {},
	"pkg/backend/clock":                 {},
	"pkg/backend/causes":                {"pkg/algo"},
	"pkg/backend/redis":                 {"pkg/algo", "pkg/backend/overlimit", "pkg/backend/breaker", "pkg/backend/clock", "pkg/backend/causes", "pkg/backend/stats", "pkg/opterr"},
	"pkg/backend/redis/redistest":       {"internal/testproc"},
	"pkg/backend/memcache":              {"pkg/algo", "pkg/backend/overlimit", "pkg/backend/breaker", "pkg/backend/clock", "pkg/backend/causes", "pkg/backend/stats", "pkg/opterr"},
	"pkg/backend/memcache/memcachetest": {"internal/testproc"},
	"pkg/backend/postgres":              {"pkg/algo", "pkg/backend/breaker", "pkg/backend/clock", "pkg/backend/causes", "pkg/backend/stats"},
	"pkg/backend/postgres/pgtest":       {"internal/testproc"},
	"pkg/telemetry":                     {"pkg/algo", "pkg/opterr"},
	"pkg/telemetry/statsd":              {},
	"pkg/service":                       {"pkg/algo", "pkg/policy", "pkg/telemetry/statsd", "pkg/loglimit", "pkg/opterr"},
	"pkg/loglimit":                      {},
	"pkg/opterr":                        {}, // a leaf every option-validating package may import
	"pkg/replay":                        {"pkg/algo", "pkg/policy", "pkg/service"},
	"pkg/client":                        {"pkg/algo"},
	"pkg/rlqs":                          {"pkg/algo", "pkg/policy", "pkg/fairshare", "pkg/loglimit", "pkg/opterr", "pkg/backend/clock"},
	"cmd/ratelimitd/...": {
		"cmd/ratelimitd/...",
		"pkg/algo", "pkg/policy", "pkg/policy/xds", "pkg/service", "pkg/replay", "pkg/rlqs",
		"pkg/backend/memory", "pkg/backend/redis", "pkg/backend/memcache", "pkg/backend/overlimit",
		"pkg/backend/postgres", "pkg/backend/stats",
		"internal/validatecmd",
		"pkg/telemetry", "pkg/telemetry/statsd", "pkg/lease",
		"internal/compat",
		"internal/events",
		"internal/logging",
		"internal/configsource",
		"internal/listen",
		"internal/replaycmd",
		"internal/boundary",
		"internal/secrets",
		"internal/gcpolicy",
		"internal/serveopts",
	},
	"internal/serveopts": {
		"pkg/policy", "pkg/policy/xds", "pkg/service", "pkg/rlqs", "pkg/lease",
		"pkg/backend/memory", "pkg/backend/redis", "pkg/backend/memcache", "pkg/backend/postgres",
		"pkg/telemetry", "pkg/telemetry/statsd", "pkg/opterr",
		"internal/compat", "internal/events", "internal/gcpolicy", "internal/secrets",
	},
	"internal/gcpolicy":     {},
	"internal/tlsreload":    {},
	"internal/secrets":      {"pkg/backend/redis", "pkg/backend/postgres"},
	"internal/boundary":     {"internal/tlsreload", "internal/secrets"},
	"internal/replaycmd":    {"pkg/policy", "pkg/replay", "pkg/service", "pkg/backend/memory", "pkg/backend/redis"},
	"internal/listen":       {"internal/boundary", "internal/secrets", "pkg/service"},
	"internal/configsource": {"pkg/policy", "pkg/policy/xds", "pkg/service"},
	"internal/logging":      {},
	"internal/events":       {"pkg/backend/redis"},
	"internal/compat":       {},
	"internal/validatecmd":  {"internal/compat", "pkg/policy", "pkg/backend/memcache", "pkg/backend/postgres"},
	"cmd/rlload":            {},
	"examples/client":       {},
	"internal/testproc":     {},
	"internal/doccheck":     {},
	"internal/golden":       {},
	"internal/deploytest":   {"internal/testproc"},
	"scripts/housekeeping":  {"internal/doccheck"},
	"scripts/bench/noop":    {},
	"scripts/bench/floor":   {},
	// Test-only packages: their non-test code is a package doc at most;
	// their tests may import any package of the module.
	"deploy":            {},
	"deploy/helm":       {},
	"envoy":             {},
	"k8s":               {},
	"examples/website":  {},
	"internal/archtest": {},
	"internal/e2e":      {},
	"internal/faults":   {},
	"internal/redise2e": {},
	"internal/refdiff":  {},
}

// match reports whether pkg (relative to the module) matches pattern: the
// same path, or for "dir/..." dir itself or any package below it.
func match(pattern, pkg string) bool {
	if dir, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == dir || strings.HasPrefix(pkg, dir+"/")
	}
	return pkg == pattern
}

// entry returns the mayImport key for pkg: its exact path, else the
// longest matching "dir/..." pattern.
func entry(pkg string) (string, bool) {
	if _, ok := mayImport[pkg]; ok {
		return pkg, true
	}
	best := ""
	for k := range mayImport {
		if strings.HasSuffix(k, "/...") && match(k, pkg) && len(k) > len(best) {
			best = k
		}
	}
	return best, best != ""
}

// modulePackages returns every package of the module (relative paths,
// sorted) with its direct non-test imports inside the module.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p, ok := strings.CutPrefix(f[0], mod)
		if !ok {
			if f[0] != strings.TrimSuffix(mod, "/") {
				t.Fatalf("go list: %s is outside %s", f[0], mod)
			}
			p = "."
		}
		var imps []string
		for _, imp := range f[1:] {
			if r, ok := strings.CutPrefix(imp, mod); ok {
				imps = append(imps, r)
			}
		}
		pkgs[p] = imps
	}
	return pkgs
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../../"+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestImportDirection: every package of the module has a mayImport entry,
// imports only what its entry allows, and every entry matches a package.
func TestImportDirection(t *testing.T) {
	pkgs := modulePackages(t)
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	used := map[string]bool{}
	for _, p := range names {
		key, ok := entry(p)
		if !ok {
			t.Errorf("package %s has no entry in mayImport (internal/archtest/imports_test.go): add it to the table there, with the module packages it may import, and a row to docs/architecture.md", p)
			continue
		}
		used[key] = true
		for _, imp := range pkgs[p] {
			if !slices.ContainsFunc(mayImport[key], func(pat string) bool { return match(pat, imp) }) {
				t.Errorf("%s imports %s; its entry %q in mayImport allows only %v", p, imp, key, mayImport[key])
			}
		}
	}
	for k := range mayImport {
		if !used[k] {
			t.Errorf("mayImport entry %q matches no package of the module: remove or rename it", k)
		}
	}
}

// TestAlgoStdlibOnly: pkg/algo imports the standard library only.
func TestAlgoStdlibOnly(t *testing.T) {
	for _, d := range deps(t, "pkg/algo") {
		if d != mod+"pkg/algo" {
			t.Errorf("pkg/algo must import the standard library only, imports %s", d)
		}
	}
}

// TestFairshareStdlibOnly: pkg/fairshare imports the standard library only.
func TestFairshareStdlibOnly(t *testing.T) {
	for _, d := range deps(t, "pkg/fairshare") {
		if d != mod+"pkg/fairshare" {
			t.Errorf("pkg/fairshare must import the standard library only, imports %s", d)
		}
	}
}

// TestImportTableCatchesViolations runs the checks of TestImportDirection
// on made-up packages, so that a table or matcher bug that lets everything
// through fails here.
func TestImportTableCatchesViolations(t *testing.T) {
	for _, c := range []struct {
		pkg, imp string
		ok       bool
	}{
		{"pkg/service", "pkg/backend/redis", false},
		{"pkg/service", "pkg/policy", true},
		{"pkg/backend/redis", "pkg/service", false},
		{"pkg/backend/memory", "pkg/policy", false},
		{"pkg/policy", "pkg/service", false},
		{"cmd/ratelimitd", "pkg/backend/redis/redistest", false},
		{"cmd/ratelimitd", "pkg/algo/algotest", false},
		{"cmd/ratelimitd/settings", "pkg/service", true},
		{"cmd/ratelimitd", "cmd/ratelimitd/settings", true},
		{"pkg/algo", "pkg/policy", false},
	} {
		key, ok := entry(c.pkg)
		if !ok {
			t.Fatalf("%s: no entry", c.pkg)
		}
		got := slices.ContainsFunc(mayImport[key], func(pat string) bool { return match(pat, c.imp) })
		if got != c.ok {
			t.Errorf("%s importing %s: allowed=%v, want %v", c.pkg, c.imp, got, c.ok)
		}
	}
	if _, ok := entry("pkg/newthing"); ok {
		t.Error("a package with no entry (pkg/newthing) was matched by a pattern")
	}
}
