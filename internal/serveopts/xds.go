package serveopts

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
)

// validateXDS checks the --xds-* flags (with --config-source=xds). Errors
// name the flag, never a header value.
func (o Options) validateXDS() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(o.XDS.ServerURL) == "" {
		add("--xds-server-url: required with --config-source=xds")
	}
	if strings.TrimSpace(o.XDS.NodeID) == "" {
		add("--xds-node-id: required with --config-source=xds (the node the server keys its snapshot by)")
	}
	if _, err := xds.ParseNodeMetadata(o.XDSNodeMetadata); err != nil {
		add("--xds-node-metadata: %v (want key=value,key2=value2)", err)
	}
	if _, err := xds.ParseHeaders(o.XDSHeaders); err != nil {
		add("--xds-headers: %v (want name:value,name2:value2)", err)
	}
	// 0 would be the package's default: these flags' rules are stated
	// here (xds.Options.Validate's, through validateOwners, are then
	// skipped for them).
	if o.XDS.ConnectRetryInterval <= 0 {
		add("--xds-connect-retry-interval=%s: must be > 0", o.XDS.ConnectRetryInterval)
	}
	if o.XDS.BackoffInitial <= 0 {
		add("--xds-backoff-initial=%s: must be > 0", o.XDS.BackoffInitial)
	}
	// A positive --xds-backoff-max below --xds-backoff-initial is
	// xds.BackoffMax's rule.
	if o.XDS.BackoffMax <= 0 && o.XDS.BackoffInitial > 0 {
		add("--xds-backoff-max=%s: must be >= --xds-backoff-initial (%s)", o.XDS.BackoffMax, o.XDS.BackoffInitial)
	} else if o.XDS.BackoffMax <= 0 {
		add("--xds-backoff-max=%s: must be > 0", o.XDS.BackoffMax)
	}
	if (o.XDSTLSCert == "") != (o.XDSTLSKey == "") {
		add("--xds-tls-cert and --xds-tls-key go together")
	}
	if !o.XDSTLS {
		for _, f := range []struct{ name, v string }{{"xds-tls-cert", o.XDSTLSCert}, {"xds-tls-key", o.XDSTLSKey}, {"xds-tls-ca", o.XDSTLSCA}, {"xds-tls-san", o.XDSTLSSAN}} {
			if f.v != "" {
				add("--%s needs --xds-tls", f.name)
			}
		}
	}
	return errors.Join(errs...)
}

// XDSOptions builds the xDS client's options from validated Options; the
// TLS files are read once here, so a missing or malformed one fails
// startup.
func XDSOptions(o Options, log *slog.Logger, load policy.LoadOptions) (xds.Options, error) {
	md, err := xds.ParseNodeMetadata(o.XDSNodeMetadata)
	if err != nil {
		return xds.Options{}, fmt.Errorf("--xds-node-metadata: %w", err)
	}
	headers, err := xds.ParseHeaders(o.XDSHeaders)
	if err != nil {
		return xds.Options{}, fmt.Errorf("--xds-headers: %w", err)
	}
	xo := xdsBase(o)
	xo.NodeMetadata, xo.Headers, xo.Load, xo.Logger = md, headers, load, log
	if o.XDSTLS {
		if xo.TLS, err = xds.ClientTLS(o.XDSTLSCert, o.XDSTLSKey, o.XDSTLSCA, o.XDSTLSSAN); err != nil {
			return xds.Options{}, err
		}
	}
	return xo, nil
}

// xdsBase is the xds.Options of the --xds-* flags that need no parsing or
// file (validated by xds.Options.Validate, through
// Options.validateOwners): o.XDS with the flags' spread and jitter.
func xdsBase(o Options) xds.Options {
	xo := o.XDS
	xo.BackoffRandomFactor = backoffRandomFactor(xo.BackoffRandomFactor)
	xo.DisableBackoffJitter = !o.XDSBackoffJitter
	return xo
}

// backoffRandomFactor is the xds.Options.BackoffRandomFactor of
// --xds-backoff-random-factor=f: f, or xds.NoBackoffSpread for 0 (no
// spread, as envoyproxy/ratelimit reads XDS_CLIENT_BACKOFF_RANDOM_FACTOR=0);
// a negative f stays invalid.
func backoffRandomFactor(f float64) float64 {
	switch {
	case f == 0:
		return xds.NoBackoffSpread
	case f < 0:
		return math.NaN() // refused by xds.Options.Validate, never NoBackoffSpread
	}
	return f
}
