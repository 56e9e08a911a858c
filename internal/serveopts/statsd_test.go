package serveopts

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestLegacyStatsd: envoyproxy/ratelimit's statsd variables: ratelimitd
// sends statsd only with USE_STATSD=true (or --statsd-addr); what the
// reference would do with USE_STATSD unset (its default is true) is kept in
// StatsdReferenceAddr.
func TestLegacyStatsd(t *testing.T) {
	for _, tt := range []struct {
		name         string
		env          []string
		args         []string
		addr, ref    string
		flush        time.Duration
		warnContains string
	}{
		{name: "nothing set", ref: "localhost:8125", flush: 10 * time.Second},
		{name: "Envoy Gateway", env: []string{"USE_STATSD", "true", "STATSD_PORT", "9125"}, addr: "localhost:9125", flush: 10 * time.Second},
		{name: "host and interval", env: []string{"USE_STATSD", "1", "STATSD_HOST", "statsd.monitoring", "STATSD_PORT", "8126", "STATS_FLUSH_INTERVAL", "1s"}, addr: "statsd.monitoring:8126", flush: time.Second},
		{name: "off", env: []string{"USE_STATSD", "false", "STATSD_HOST", "h"}, flush: 10 * time.Second},
		{name: "disabled stats", env: []string{"USE_STATSD", "true", "DISABLE_STATS", "true"}, flush: 10 * time.Second},
		{name: "prometheus chosen", env: []string{"USE_PROMETHEUS", "true"}, flush: 10 * time.Second},
		{name: "dogstatsd chosen", env: []string{"USE_DOG_STATSD", "true"}, flush: 10 * time.Second, warnContains: "USE_DOG_STATSD"},
		{name: "host without USE_STATSD", env: []string{"STATSD_HOST", "h"}, ref: "h:8125", flush: 10 * time.Second, warnContains: "STATSD_HOST (statsd is sent only with USE_STATSD=true"},
		{name: "tcp protocol", env: []string{"USE_STATSD", "true", "STATSD_PROTOCOL", "tcp"}, addr: "localhost:8125", flush: 10 * time.Second, warnContains: "STATSD_PROTOCOL=tcp"},
		{name: "flag wins", env: []string{"USE_STATSD", "true", "RATELIMITD_STATSD_FLUSH_INTERVAL", "3s"}, args: []string{"--statsd-addr=127.0.0.1:1"}, addr: "127.0.0.1:1", flush: 3 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, warnings, err := Parse(tt.args, env(tt.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if o.StatsdAddr != tt.addr || o.StatsdReferenceAddr != tt.ref || o.StatsdFlushInterval != tt.flush {
				t.Errorf("addr %q ref %q flush %s, want %q %q %s", o.StatsdAddr, o.StatsdReferenceAddr, o.StatsdFlushInterval, tt.addr, tt.ref, tt.flush)
			}
			joined := strings.Join(warnings, "\n")
			if tt.warnContains == "" && joined != "" {
				t.Errorf("warnings %q, want none", joined)
			}
			if tt.warnContains != "" && !strings.Contains(joined, tt.warnContains) {
				t.Errorf("warnings %q, want one naming %q", joined, tt.warnContains)
			}
			ref := o
			ref.useReferenceStatsd()
			if want := tt.addr; want == "" && ref.StatsdAddr != tt.ref {
				t.Errorf("useReferenceStatsd: %q, want %q", ref.StatsdAddr, tt.ref)
			}
		})
	}
	for _, bad := range [][]string{
		{"USE_STATSD", "yes please"},
		{"USE_STATSD", "true", "STATSD_PORT", "http"},
		{"STATS_FLUSH_INTERVAL", "10"},
		{"STATS_FLUSH_INTERVAL", "-1s"},
	} {
		if _, _, err := Parse(nil, env(bad...), io.Discard); err == nil || !strings.Contains(err.Error(), bad[len(bad)-2]) {
			t.Errorf("%v: error %v, want one naming %s", bad, err, bad[len(bad)-2])
		}
	}
	if _, _, err := Parse([]string{"--statsd-addr=nohostport"}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "--statsd-addr") {
		t.Errorf("--statsd-addr=nohostport: %v", err)
	}
	if _, _, err := Parse([]string{"--statsd-flush-interval=0s"}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "--statsd-flush-interval") {
		t.Errorf("--statsd-flush-interval=0s: %v", err)
	}
}
