package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/compat"
	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// validateRun runs `ratelimitd validate args...` with the environment kv
// and returns the exit code and stdout+stderr.
func validateRun(args []string, kv ...string) (int, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"validate"}, args...), env(kv...), &out, &errb)
	return code, out.String() + errb.String()
}

const refValidateConfig = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

// TestValidateReferenceConfigDir: with the reference's variables and no
// PATH, validate checks the directory serve loads in reference mode:
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func TestValidateReferenceConfigDir(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"config", "rules"} {
		if err := os.MkdirAll(filepath.Join(root, "ratelimit", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeTestFile(t, filepath.Join(root, "ratelimit", "config", "a.yaml"), refValidateConfig)
	writeTestFile(t, filepath.Join(root, "ratelimit", "rules", "b.yaml"), "domain: other\n")
	vars := []string{"RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "ratelimit", "RUNTIME_WATCH_ROOT", "false"}
	o, _, err := serveopts.Parse(nil, env(append(vars, "REDIS_URL", "127.0.0.1:6379")...), io.Discard)
	if err != nil || !o.Reference || len(o.Config) != 1 {
		t.Fatalf("serve: reference %t, config %v, %v", o.Reference, o.Config, err)
	}
	code, out := validateRun(nil, vars...)
	if code != 0 || !strings.Contains(out, "ok: 1 domain(s), 1 rule(s)") || !strings.Contains(out, o.Config[0]) {
		t.Errorf("validate, no PATH: exit %d, want 0 and the directory serve loads (%s):\n%s", code, o.Config[0], out)
	}
	code, out = validateRun(nil, append(vars, "RUNTIME_APPDIRECTORY", "rules")...)
	if code != 0 || !strings.Contains(out, "ok: 1 domain(s), 0 rule(s)") {
		t.Errorf("validate, RUNTIME_APPDIRECTORY=rules: exit %d\n%s", code, out)
	}
	writeTestFile(t, filepath.Join(root, "ratelimit", "config", "bad.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if code, out = validateRun(nil, vars...); code != 1 || !strings.Contains(out, "bad.yaml:4") {
		t.Errorf("validate, invalid file in the directory: exit %d, want 1 naming it\n%s", code, out)
	}
	// RATELIMITD_CONFIG outranks the variables (serve: native mode, its
	// config); with --mode=reference it is the path reference mode loads.
	if code, out = validateRun(nil, append(vars, "RATELIMITD_CONFIG", filepath.Join(root, "ratelimit", "rules"))...); code != 2 {
		t.Errorf("validate, RATELIMITD_CONFIG (native), no PATH: exit %d, want 2 (usage)\n%s", code, out)
	}
	if code, out = validateRun([]string{"--mode=reference"}, append(vars, "RATELIMITD_CONFIG", filepath.Join(root, "ratelimit", "rules"))...); code != 0 || !strings.Contains(out, "ok: 1 domain(s), 0 rule(s)") {
		t.Errorf("validate --mode=reference, RATELIMITD_CONFIG: exit %d\n%s", code, out)
	}
	// Without any variable, reference mode's default directory.
	if code, out = validateRun([]string{"--mode", "reference"}); code != 1 || !strings.Contains(out, compat.ReferenceConfigDir) {
		t.Errorf("validate --mode reference, no variable: exit %d, want 1 naming %s\n%s", code, compat.ReferenceConfigDir, out)
	}
	// A config from xDS has no directory to check.
	if code, out = validateRun(nil, "CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL", "127.0.0.1:18000"); code != 2 || !strings.Contains(out, "xDS") {
		t.Errorf("validate, CONFIG_TYPE=GRPC_XDS_SOTW, no PATH: exit %d, want 2\n%s", code, out)
	}
	if code, out = validateRun([]string{"--mode=other"}, vars...); code != 2 || !strings.Contains(out, `--mode="other"`) {
		t.Errorf("validate --mode=other: exit %d, want 2\n%s", code, out)
	}
}

// TestValidateReferenceSameFileTwice: in reference mode a file named twice
// is loaded twice, as envoyproxy/ratelimit loads every file it is given: a
// duplicate key with MERGE_DOMAIN_CONFIG=true (its
// TestDuplicateKeyDomainMerge), a duplicate domain without. Native mode
// loads it once.
func TestValidateReferenceSameFileTwice(t *testing.T) {
	f := filepath.Join(t.TempDir(), "merge_domain_key1.yaml")
	writeTestFile(t, f, refValidateConfig)
	for _, c := range []struct {
		name string
		args []string
		kv   []string
		code int
		want string
	}{
		{"reference, merged", []string{f, f}, []string{"MERGE_DOMAIN_CONFIG", "true", "RUNTIME_ROOT", "/srv"}, 1, "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"reference", []string{f, f}, []string{"RUNTIME_ROOT", "/srv"}, 1, "duplicate domain"},
		{"--mode=reference", []string{"--mode=reference", "--merge-domains", f, f}, nil, 1, "duplicate descriptor composite key"},
		{"RATELIMITD_MODE=reference", []string{f, f}, []string{"RATELIMITD_MODE", "reference"}, 1, "duplicate domain"},
		{"native", []string{f, f}, []string{"MERGE_DOMAIN_CONFIG", "true"}, 0, "ok: 1 domain(s), 1 rule(s)"},
		{"--mode=native", []string{"--mode=native", f, f}, []string{"RUNTIME_ROOT", "/srv"}, 0, "ok: 1 domain(s), 1 rule(s)"},
		{"reference, once", []string{f}, []string{"MERGE_DOMAIN_CONFIG", "true", "RUNTIME_ROOT", "/srv"}, 0, "ok: 1 domain(s), 1 rule(s)"},
	} {
		if code, out := validateRun(c.args, c.kv...); code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, want %d with %q\n%s", c.name, code, c.code, c.want, out)
		}
	}
}

// TestReferenceDotfilesDefault: reference mode loads dot files unless
// RUNTIME_IGNOREDOTFILES=true (the reference's default is false): a
// ConfigMap volume, which shows each file twice (its ..<timestamp>
// directory), is refused as the reference refuses it; serve and validate
// agree. A flag or twin still decides, and native mode keeps skipping them.
func TestReferenceDotfilesDefault(t *testing.T) {
	dir := configMapDir(t, map[string]string{"a.yaml": refValidateConfig})
	for _, c := range []struct {
		name   string
		args   []string
		kv     []string
		ignore bool
	}{
		{"reference, unset", nil, []string{"RUNTIME_ROOT", "/srv"}, false},
		{"reference, empty", nil, []string{"RUNTIME_IGNOREDOTFILES", ""}, false},
		{"reference, false", nil, []string{"RUNTIME_IGNOREDOTFILES", "false"}, false},
		{"reference, true", nil, []string{"RUNTIME_IGNOREDOTFILES", "true"}, true},
		{"reference, flag", []string{"--ignore-dotfiles"}, []string{"RUNTIME_ROOT", "/srv"}, true},
		{"reference, twin", nil, []string{"RUNTIME_ROOT", "/srv", "RATELIMITD_IGNORE_DOTFILES", "true"}, true},
		{"native", nil, nil, true},
		{"native, false", nil, []string{"RATELIMITD_IGNORE_DOTFILES", "false"}, false},
	} {
		o, _, err := serveopts.Parse(c.args, env(append(c.kv, "RATELIMITD_BACKEND", "memory")...), io.Discard)
		if err != nil {
			t.Fatalf("%s: serve: %v", c.name, err)
		}
		if o.IgnoreDotfiles != c.ignore {
			t.Errorf("%s: serve ignore-dotfiles %t, want %t", c.name, o.IgnoreDotfiles, c.ignore)
		}
		code, out := validateRun(append(append([]string{}, c.args...), dir), c.kv...)
		if c.ignore && code != 0 || !c.ignore && (code != 1 || !strings.Contains(out, "duplicate domain")) {
			t.Errorf("%s: validate exit %d, want the load serve does (dot files skipped %t)\n%s", c.name, code, c.ignore, out)
		}
	}
}
