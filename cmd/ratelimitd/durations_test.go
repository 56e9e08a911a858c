package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestDurationFlagErrorPrinted: the command prints the flag's error once,
// with the short hint; -h still names the flags' type.
func TestDurationFlagErrorPrinted(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--redis-timeout", "10"}, env(), &out, &errb); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	want := "ratelimitd serve: --redis-timeout=10: missing unit (e.g. 10ms or 10s)\nRun 'ratelimitd serve -h' for the flags.\n"
	if errb.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errb.String(), want)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"serve", "-h"}, env(), &out, &errb); code != 0 ||
		!strings.Contains(errb.String(), "-redis-timeout duration\n") {
		t.Errorf("-h: exit %d, usage:\n%s", code, errb.String())
	}
}

// TestReplayDurationFlagErrors: `ratelimitd replay`'s duration flags refuse
// a bare number as serve's do (serveopts.TestDurationFlagErrors).
func TestReplayDurationFlagErrors(t *testing.T) {
	_, err := parseReplay([]string{"--redis-timeout", "10"}, io.Discard)
	if want := "--redis-timeout=10: missing unit (e.g. 10ms or 10s)"; err == nil || err.Error() != want {
		t.Errorf("replay --redis-timeout 10: error %v, want %q", err, want)
	}
}
