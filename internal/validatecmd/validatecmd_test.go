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
