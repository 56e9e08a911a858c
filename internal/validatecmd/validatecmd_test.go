package validatecmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigFlag: `validate --config` names config paths as serve's
// --config does (repeatable, comma-separated), the same as PATH
// arguments.
func TestConfigFlag(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := "domain: " + filepath.Base(d) + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
		if err := os.WriteFile(filepath.Join(d, "c.yaml"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := Env{Lookup: func(string) (string, bool) { return "", false }}
	for _, args := range [][]string{
		{"--config", a + "," + b},
		{"--config=" + a, "--config=" + b},
		{"--config", a, b},
	} {
		var out, errOut bytes.Buffer
		if code := Run(args, env, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "ok: 2 domain(s)") {
			t.Errorf("validate %q: exit %d, %q %q, want 0 and both domains", args, code, out.String(), errOut.String())
		}
	}
}

// TestDurableLeasedOneError: `validate --durable` on a leased durable
// limit prints its error and nothing else: no warning about what a
// leased limit of that window would cost, since none loads.
func TestDurableLeasedOneError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "d.yaml")
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100, store: durable, consistency: leased}\n"
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := Env{Lookup: func(string) (string, bool) { return "", false }}
	var out, errOut bytes.Buffer
	code := Run([]string{"--durable", file}, env, &out, &errOut)
	want := file + ":4: consistency: leased is not available with store: durable"
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
		t.Errorf("validate --durable: exit %d, output %q, want exit 1 and one line %q…", code, out.String(), want)
	}
	if !strings.Contains(errOut.String(), "invalid: 1 error(s), 0 warning(s)") {
		t.Errorf("validate --durable: %q, want 1 error and 0 warnings", errOut.String())
	}
}
