package main

import (
	"io"
	"strings"
	"testing"
)

// TestInvokedAsRatelimit: invoked as ratelimit with no subcommand, the
// binary serves (a usage error from serve's flag parsing proves serve ran,
// without listening).
func TestInvokedAsRatelimit(t *testing.T) {
	var stderr strings.Builder
	code := runAs(t.Context(), "/bin/ratelimit", []string{"--no-such-flag"}, env(), io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "ratelimitd serve:") {
		t.Errorf("ratelimit --no-such-flag: exit %d, %q; want serve's usage error", code, stderr.String())
	}
	stderr.Reset()
	code = runAs(t.Context(), "/bin/ratelimit", []string{"version"}, env(), &stderr, io.Discard)
	if code != 0 || !strings.Contains(stderr.String(), "ratelimitd ") {
		t.Errorf("ratelimit version: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	code = runAs(t.Context(), "/usr/local/bin/ratelimitd", nil, env(), io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "Usage:") {
		t.Errorf("ratelimitd with no command: exit %d, want usage", code)
	}
}
