package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
)

// TestServeFlagErrorOnce: a bad flag value is printed once, with a short
// hint, not the whole usage.
func TestServeFlagErrorOnce(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--shutdown-grace", "abc"}, env(), &out, &errb)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	got := errb.String()
	if n := strings.Count(got, `--shutdown-grace=abc: not a duration`); n != 1 {
		t.Errorf("error printed %d times:\n%s", n, got)
	}
	if strings.Contains(got, "-redis-url") || !strings.Contains(got, "ratelimitd serve -h") {
		t.Errorf("want a short hint, not the usage:\n%s", got)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"serve", "-h"}, env(), &out, &errb); code != 0 || !strings.Contains(errb.String(), "-memory-max-keys") {
		t.Errorf("-h: exit %d, usage:\n%s", code, errb.String())
	}
}

// TestValidateEmptyConfig: a directory with no config file is valid but
// warned (exit 0, 1 with --strict), and an unknown flag is named once
// without the whole usage (exit 2).
func TestValidateEmptyConfig(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "notes.txt"), "x")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", dir}, env(), &out, &errb); code != 0 {
		t.Errorf("validate: exit %d, want 0\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "warning: no rate-limit domains loaded from "+dir) {
		t.Errorf("no warning:\n%s", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"validate", "--strict", dir}, env(), &out, &errb); code != 1 {
		t.Errorf("validate --strict: exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"validate", "--nope", dir}, env(), &out, &errb); code != 2 ||
		strings.Count(errb.String(), "-nope") != 1 || strings.Contains(errb.String(), "-merge-domains") {
		t.Errorf("bad flag: exit %d\n%s", code, errb.String())
	}
}

// TestValidateBackendAlgorithms: validate --backend=memcache (or
// BACKEND_TYPE=memcache) refuses the algorithms memcached cannot decide, as
// serve would.
func TestValidateBackendAlgorithms(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}\n"
	writeTestFile(t, filepath.Join(dir, "d.yaml"), cfg)
	for _, c := range []struct {
		args []string
		env  []string
		code int
	}{
		{[]string{"validate", dir}, nil, 0},
		{[]string{"validate", "--backend=redis", dir}, nil, 0},
		{[]string{"validate", "--backend=memcache", dir}, nil, 1},
		{[]string{"validate", dir}, []string{"BACKEND_TYPE", "memcache"}, 1},
		{[]string{"validate", dir}, []string{"RATELIMITD_BACKEND", "memcached"}, 1},
		{[]string{"validate", "--backend=etcd", dir}, nil, 2},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(c.env...), &out, &errb)
		if code != c.code {
			t.Errorf("%v %v: exit %d, want %d\n%s%s", c.args, c.env, code, c.code, out.String(), errb.String())
		}
		if c.code == 1 && !strings.Contains(out.String(), "d.yaml:4: descriptor \"d.k\": algorithm sliding_window is not supported by the memcache backend") {
			t.Errorf("%v %v: output lacks the refusal:\n%s", c.args, c.env, out.String())
		}
	}
}

// TestValidateBackendPenalty: validate --backend=memcache refuses a penalty
// box, which memcached cannot decide atomically, at its line; the other
// backends load it.
func TestValidateBackendPenalty(t *testing.T) {
	dir := t.TempDir()
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    penalty: {after: 3, within: 1h, block: 5m}\n"
	writeTestFile(t, filepath.Join(dir, "d.yaml"), cfg)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"validate", dir}, 0},
		{[]string{"validate", "--backend=redis", dir}, 0},
		{[]string{"validate", "--backend=memcache", dir}, 1},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(), &out, &errb)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, c.code, out.String(), errb.String())
		}
		if c.code == 1 && !strings.Contains(out.String(), `d.yaml:5: descriptor "d.k": penalty is not supported by the memcache backend`) {
			t.Errorf("%v: output lacks the refusal:\n%s", c.args, out.String())
		}
	}
}

// configMapDir lays out files as the kubelet mounts a ConfigMap volume:
// ..<timestamp>/ holding the files, ..data -> ..<timestamp>, and a
// symlink <name> -> ..data/<name> per file.
func configMapDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_12_01_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeTestFile(t, filepath.Join(dir, ts, name), content)
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestValidateConfigMapDir: validate and serve read --ignore-dotfiles alike
// (same default, flag, twin and envoyproxy/ratelimit variable): validate
// accepts the ConfigMap-shaped directory serve loads, and where both are
// told not to skip dot entries validate's error names the dot directory.
func TestValidateConfigMapDir(t *testing.T) {
	dir := configMapDir(t, map[string]string{
		"example.yaml": "domain: example\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	})
	for _, c := range []struct {
		name string
		args []string
		env  []string
	}{
		{"defaults", nil, nil},
		{"flag off", []string{"--ignore-dotfiles=false"}, nil},
		{"flag on", []string{"--ignore-dotfiles"}, []string{"RATELIMITD_IGNORE_DOTFILES", "false"}},
		{"twin off", nil, []string{"RATELIMITD_IGNORE_DOTFILES", "false"}},
		{"reference off", nil, []string{"RUNTIME_IGNOREDOTFILES", "false"}},
		{"twin wins", nil, []string{"RUNTIME_IGNOREDOTFILES", "false", "RATELIMITD_IGNORE_DOTFILES", "1"}},
		{"reference empty", nil, []string{"RUNTIME_IGNOREDOTFILES", ""}},
	} {
		o, _, err := serveopts.Parse(c.args, env(c.env...), io.Discard)
		if err != nil {
			t.Fatalf("%s: serve: %v", c.name, err)
		}
		var out, errb bytes.Buffer
		code := run(context.Background(), append(append([]string{"validate"}, c.args...), dir), env(c.env...), &out, &errb)
		switch {
		case o.IgnoreDotfiles && (code != 0 || !strings.Contains(errb.String(), "ok: 1 domain(s), 1 rule(s)")):
			t.Errorf("%s: serve skips dot entries, validate exit %d:\n%s%s", c.name, code, out.String(), errb.String())
		case !o.IgnoreDotfiles && (code != 1 || !strings.Contains(out.String(), "set the ignore-dotfiles option") || !strings.Contains(out.String(), "RUNTIME_IGNOREDOTFILES=true") || strings.Contains(out.String(), "merge-domains")):
			t.Errorf("%s: serve loads dot entries, validate exit %d:\n%s%s", c.name, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", dir}, env("RUNTIME_IGNOREDOTFILES", "maybe"), &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), `RUNTIME_IGNOREDOTFILES="maybe"`) {
		t.Errorf("malformed variable: exit %d\n%s", code, errb.String())
	}
}

// TestValidateConfigSizeBounds: validate refuses what serve refuses for
// size (--max-config-rules, --max-config-bytes and their twins, with
// serve's defaults), so a CI gate on validate never passes a config whose
// pod would never become ready.
func TestValidateConfigSizeBounds(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 12 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	writeTestFile(t, filepath.Join(dir, "d.yaml"), b.String())
	for _, c := range []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{[]string{"validate", dir}, nil, 0, ""},
		{[]string{"validate", "--max-config-rules=10", dir}, nil, 1, "config too large"},
		{[]string{"validate", dir}, []string{"RATELIMITD_MAX_CONFIG_RULES", "10"}, 1, "config too large"},
		{[]string{"validate", "--max-config-bytes=100", dir}, nil, 1, "config too large"},
		{[]string{"validate", "--max-config-rules=10", "--max-config-rules=0", dir}, nil, 0, ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, env(c.env...), &out, &errb)
		if code != c.code || !strings.Contains(out.String()+errb.String(), c.want) {
			t.Errorf("%v %v: exit %d, want %d with %q\n%s%s", c.args, c.env, code, c.code, c.want, out.String(), errb.String())
		}
	}
	if serveopts.Defaults().MaxConfigRules != 50_000 {
		t.Fatal("the test assumes serve's default of 50000 rules")
	}
}
