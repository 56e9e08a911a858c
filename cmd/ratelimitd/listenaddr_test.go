package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestListenAddrWithoutPortIsUsageError: a listen address whose port is
// empty (":$PORT" with PORT unset) or out of range is exit 2 naming the
// flag, before anything listens.
func TestListenAddrWithoutPortIsUsageError(t *testing.T) {
	for _, c := range []struct{ flag, value string }{
		{"grpc-addr", ":"},
		{"http-addr", "127.0.0.1:"},
		{"debug-addr", ":"},
		{"metrics-addr", ":"},
		{"grpc-addr", "127.0.0.1:99999"},
	} {
		args := []string{"serve", "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr="}
		args = append(args, "--"+c.flag+"="+c.value)
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, env(), &out, &errb); code != 2 || !strings.Contains(errb.String(), "--"+c.flag+"=") {
			t.Errorf("--%s=%s: exit %d:\n%s", c.flag, c.value, code, errb.String())
		}
	}
}
