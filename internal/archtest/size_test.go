package archtest

import (
	"bytes"
	"strings"
	"testing"
)

// maxLines bounds a non-test Go file: a file past it holds more than one
// job and is split along them.
const maxLines = 600

// TestFileSizes: no tracked non-test Go file is over maxLines lines.
func TestFileSizes(t *testing.T) {
	for _, f := range tracked(t) {
		if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") {
			continue
		}
		if n := bytes.Count(readRepo(t, f), []byte("\n")); n > maxLines {
			t.Errorf("%s: %d lines, over %d: split it along its jobs", f, n, maxLines)
		}
	}
}
