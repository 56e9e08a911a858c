package deploytest

import (
	"os"
	"path/filepath"
	"testing"
)

// KubeletVolume writes data (file name -> content) into a new temporary
// directory the way the kubelet's atomic writer lays out a ConfigMap or
// Secret volume, and returns the directory: the files are written into a
// ..<timestamp> directory, ..data is a symlink to it, and each name is a
// symlink to ..data/<name>.
func KubeletVolume(t testing.TB, data map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_01_01_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil { //nolint:gosec // a volume's files are world-readable, as the kubelet's default mode
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range data {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
