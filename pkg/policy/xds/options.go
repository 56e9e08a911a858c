package xds

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/opterr"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Defaults of Options: envoyproxy/ratelimit's, for its CONFIG_GRPC_XDS_*
// and XDS_CLIENT_* variables (docs/xds.md).
const (
	DefaultServerURL            = "localhost:18000"
	DefaultNodeID               = "default"
	DefaultConnectRetryInterval = 3 * time.Second
	DefaultBackoffInitial       = 10 * time.Second
	DefaultBackoffMax           = 60 * time.Second
	DefaultBackoffRandomFactor  = 0.5
)

// NoBackoffSpread is the BackoffRandomFactor of exact waits: no spread,
// as with DisableBackoffJitter (XDS_CLIENT_BACKOFF_RANDOM_FACTOR=0).
const NoBackoffSpread = -1.0

// Options configure Run. The zero value of a duration, the server URL,
// the node id or BackoffRandomFactor means its Default, and that of
// DisableBackoffJitter means jitter, as envoyproxy/ratelimit does; Validate says which values are invalid
// (Run reads a negative duration as its default, and a BackoffMax below
// BackoffInitial as BackoffInitial).
type Options struct {
	// ServerURL is the management server's gRPC target, host:port
	// (CONFIG_GRPC_XDS_SERVER_URL).
	ServerURL string
	// NodeID is core.v3.Node.id, the key of the server's snapshot
	// (CONFIG_GRPC_XDS_NODE_ID; Envoy Gateway serves "envoy-ratelimit").
	NodeID string
	// NodeMetadata becomes Node.metadata, each value a string
	// (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on the stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS); their values are never
	// logged (they may carry credentials).
	Headers map[string]string
	// TLS, when non-nil, returns the TLS client config of one connection
	// attempt (called before each, so rotated certificate files are read
	// again); nil means plaintext. See ClientTLS.
	TLS func() (*tls.Config, error)
	// ConnectRetryInterval is the wait after an attempt that never got a
	// stream going (connection refused, TLS handshake failed, stream
	// refused before any response), ±50% at random.
	ConnectRetryInterval time.Duration
	// BackoffInitial, BackoffMax, BackoffRandomFactor and
	// DisableBackoffJitter shape the wait after a stream that had received
	// a response ends: BackoffInitial, doubled after each further such end
	// without a good response in between, at most BackoffMax; unless
	// DisableBackoffJitter, each wait is spread uniformly over
	// ±BackoffRandomFactor of itself (XDS_CLIENT_BACKOFF_*).
	BackoffInitial time.Duration
	// BackoffMax caps the doubled wait (XDS_CLIENT_BACKOFF_MAX_INTERVAL);
	// zero or negative means DefaultBackoffMax, and a value below
	// BackoffInitial is raised to it.
	BackoffMax time.Duration
	// BackoffRandomFactor is the share of each wait spread at random, in
	// (0, 1] (XDS_CLIENT_BACKOFF_RANDOM_FACTOR). Its zero value means
	// DefaultBackoffRandomFactor; NoBackoffSpread means no spread.
	BackoffRandomFactor float64
	// DisableBackoffJitter turns the spread off: exact waits
	// (XDS_CLIENT_BACKOFF_JITTER=false). Its zero value false spreads
	// them, as envoyproxy/ratelimit and ratelimitd's --xds-backoff-jitter
	// do by default.
	DisableBackoffJitter bool
	// MaxRecvMsgSize is the largest DiscoveryResponse accepted, in bytes;
	// 0 keeps gRPC's default of 4 MiB (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES).
	MaxRecvMsgSize int
	// Load are the options every response is loaded with.
	Load policy.LoadOptions
	// Logger receives the connection's log lines (nil: slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.ServerURL == "" {
		o.ServerURL = DefaultServerURL
	}
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	if o.ConnectRetryInterval <= 0 {
		o.ConnectRetryInterval = DefaultConnectRetryInterval
	}
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = DefaultBackoffInitial
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffInitial {
		o.BackoffMax = o.BackoffInitial
	}
	if o.BackoffRandomFactor == 0 {
		o.BackoffRandomFactor = DefaultBackoffRandomFactor
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field, joined, each a
// *opterr.FieldError: a negative ConnectRetryInterval, BackoffInitial,
// BackoffMax or MaxRecvMsgSize, a BackoffMax below BackoffInitial (both
// set), and a BackoffRandomFactor outside [0, 1] other than
// NoBackoffSpread. Zero values are valid: they mean the defaults.
func (o Options) Validate() error {
	var errs []error
	bad := func(field string, v any, reason string) {
		errs = append(errs, &opterr.FieldError{Package: "xds", Field: field, Value: v, Reason: reason})
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"ConnectRetryInterval", o.ConnectRetryInterval}, {"BackoffInitial", o.BackoffInitial}, {"BackoffMax", o.BackoffMax}} {
		if d.v < 0 {
			bad(d.field, d.v, "must be >= 0")
		}
	}
	if o.BackoffMax > 0 && o.BackoffMax < o.BackoffInitial {
		bad("BackoffMax", o.BackoffMax, fmt.Sprintf("must be >= BackoffInitial (%s)", o.BackoffInitial))
	}
	if !(o.BackoffRandomFactor >= 0 && o.BackoffRandomFactor <= 1) && o.BackoffRandomFactor != NoBackoffSpread {
		bad("BackoffRandomFactor", o.BackoffRandomFactor, "must be in [0, 1]")
	}
	if o.MaxRecvMsgSize < 0 {
		bad("MaxRecvMsgSize", o.MaxRecvMsgSize, "must be >= 0 (0: gRPC's default, 4 MiB)")
	}
	return errors.Join(errs...)
}
