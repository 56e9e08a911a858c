// Package golden compares a test's output with a golden file and rewrites
// the file on request.
//
// A test calls Check(t, "testdata/x.golden", got). Run
//
//	go test -run TestX ./pkg/foo/ -update
//
// to write got to the file instead; the change then shows in the diff of
// the commit, where a reviewer sees exactly what moved.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is -update: write the golden files instead of comparing with them.
var update = flag.Bool("update", false, "rewrite the golden files under testdata from the current output")

// Check compares got with the file at path (relative to the test's package
// directory). With -update it writes got there, creating the directory,
// and passes. A missing file or a difference fails t (Errorf, the test goes
// on) with a -want +got diff and the command that rewrites the file.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%v (run go test -run '%s' -update to create it)", err, t.Name())
		return
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs from the current output (-want +got):\n%s\nIf the change is deliberate, run go test -run '%s' -update and say so in the change.", path, diff, t.Name())
	}
}
