package serveopts

import (
	"io"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
)

// TestLegacyXDSVariables: the reference's variables, as Envoy Gateway sets
// them, map onto the --xds-* options; the TLS files count only with
// CONFIG_GRPC_XDS_SERVER_USE_TLS=true; none is reported unsupported.
func TestLegacyXDSVariables(t *testing.T) {
	o, warnings, err := Parse(nil, env(
		"CONFIG_TYPE", "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit",
		"CONFIG_GRPC_XDS_NODE_METADATA", "cluster=edge",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:abc",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "5s",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "30s",
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.25",
		"XDS_CLIENT_BACKOFF_JITTER", "false",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608",
		"FORCE_START_WITHOUT_INITIAL_CONFIG", "true",
	), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %q, want none", warnings)
	}
	if o.ConfigSource != "xds" || o.XDS.ServerURL != "envoy-gateway:18001" || o.XDS.NodeID != "envoy-ratelimit" ||
		o.XDSNodeMetadata != "cluster=edge" || o.XDSHeaders != "x-token:abc" || o.XDS.ConnectRetryInterval != 5*time.Second ||
		!o.XDSTLS || o.XDSTLSCert != "/certs/tls.crt" || o.XDSTLSKey != "/certs/tls.key" || o.XDSTLSCA != "/certs/ca.crt" ||
		o.XDSTLSSAN != "envoy-gateway" || o.XDS.BackoffInitial != time.Second || o.XDS.BackoffMax != 30*time.Second ||
		o.XDS.BackoffRandomFactor != 0.25 || o.XDSBackoffJitter || o.XDS.MaxRecvMsgSize != 8<<20 {
		t.Errorf("options: %+v", o)
	}
	// Without USE_TLS the files are ignored, as by envoyproxy/ratelimit.
	o, _, err = Parse(nil, env("CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"), io.Discard)
	if err != nil || o.XDSTLS || o.XDSTLSCA != "" {
		t.Errorf("without USE_TLS: tls %v ca %q err %v", o.XDSTLS, o.XDSTLSCA, err)
	}
	// Defaults are the reference's; a flag twin wins over the variable.
	d, _, err := Parse(nil, env("CONFIG_TYPE", "file", "CONFIG_GRPC_XDS_NODE_ID", "legacy", "RATELIMITD_XDS_NODE_ID", "twin"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.ConfigSource != "file" || d.XDS.NodeID != "twin" || d.XDS.ServerURL != "localhost:18000" || d.XDS.ConnectRetryInterval != 3*time.Second ||
		d.XDS.BackoffInitial != 10*time.Second || d.XDS.BackoffMax != time.Minute || d.XDS.BackoffRandomFactor != 0.5 || !d.XDSBackoffJitter || d.XDS.MaxRecvMsgSize != 0 {
		t.Errorf("defaults: %+v", d)
	}
	// --config is not needed with xDS.
	if _, _, err := Parse([]string{"--config-source=xds", "--config="}, env(), io.Discard); err != nil {
		t.Errorf("xds without --config: %v", err)
	}
}

// TestXDSBackoffSpreadOptions: xdsBase gives xds.Options the flags'
// meaning: the default factor and jitter by default, and exact waits for
// --xds-backoff-random-factor=0 (xds.NoBackoffSpread) or
// --xds-backoff-jitter=false.
func TestXDSBackoffSpreadOptions(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		factor  float64
		disable bool
	}{
		{nil, xds.DefaultBackoffRandomFactor, false},
		{[]string{"--xds-backoff-random-factor=0"}, xds.NoBackoffSpread, false},
		{[]string{"--xds-backoff-random-factor=0.25", "--xds-backoff-jitter=false"}, 0.25, true},
	} {
		o, _, err := Parse(tc.args, env(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if xo := xdsBase(o); xo.BackoffRandomFactor != tc.factor || xo.DisableBackoffJitter != tc.disable {
			t.Errorf("%q: factor %v, jitter disabled %v; want %v, %v", tc.args, xo.BackoffRandomFactor, xo.DisableBackoffJitter, tc.factor, tc.disable)
		}
	}
}
