// Package xds delivers rate-limit configs over xDS, as envoyproxy/ratelimit
// does with CONFIG_TYPE=GRPC_XDS_SOTW: an aggregated discovery service
// (ADS) client, state of the world, subscribed to every resource of type
// ratelimit.config.ratelimit.v3.RateLimitConfig (TypeURL) of one node.
// Every response holds the complete set of configs; it is converted to
// config documents (ToYAML), loaded through the same validation as config
// files (policy.LoadSources), and ACKed when it loads, NACKed with the
// validation error as error_detail when it does not, in which case the
// config in force stays. Servers built on go-control-plane's snapshot
// cache (Envoy Gateway's) are the intended peers.
package xds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// failureLogEvery is how often consecutive failed connection attempts
// are logged at warn after the first.
const failureLogEvery = time.Minute

// maxErrorDetail bounds the NACK's error_detail message, in bytes: a
// config with thousands of problems is reported by its first ones.
const maxErrorDetail = 16 << 10

// ClientTLS returns a TLS config source for Options.TLS: the client
// certificate and key (PEM files; both or neither) for mutual TLS, the CA
// bundle that signs the server's certificate (PEM; "" = the system roots)
// and the name the server's certificate must carry (serverName; "" = the
// host of the server URL). The files are read on every call, and once
// here so that a missing or malformed file fails at startup.
func ClientTLS(certFile, keyFile, caFile, serverName string) (func() (*tls.Config, error), error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("xds: client certificate and key go together")
	}
	load := func() (*tls.Config, error) {
		c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		if certFile != "" {
			kp, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("xds: client certificate: %w", err)
			}
			c.Certificates = []tls.Certificate{kp}
		}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("xds: server CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("xds: server CA %s: no PEM certificate", caFile)
			}
			c.RootCAs = pool
		}
		return c, nil
	}
	if _, err := load(); err != nil {
		return nil, err
	}
	return load, nil
}

// Run subscribes to o.NodeID's RateLimitConfig resources at o.ServerURL
// until ctx is done, and then returns ctx.Err(). A response that loads
// goes to apply and is ACKed; one that fails goes to fail and is NACKed,
// so the config in force stays (a rejected response sent again is NACKed
// without loading it). apply and fail are called on Run's goroutine one at
// a time. A stream that ends is reopened after a backoff; connection
// problems are logged, not passed to fail, as they say nothing about the
// config.
func Run(ctx context.Context, o Options, apply func(*policy.Set, []policy.Warning), fail func(error)) error {
	o.defaults()
	c := &client{o: o, log: o.Logger.With("xds_server", o.ServerURL, "node_id", o.NodeID), apply: apply, fail: fail}
	return c.run(ctx)
}

type client struct {
	o     Options
	log   *slog.Logger
	apply func(*policy.Set, []policy.Warning)
	fail  func(error)

	lastWarn time.Time // when a failed connection attempt was last logged at warn
	failures int       // consecutive failed connection attempts
}

func (c *client) run(ctx context.Context) error {
	c.log.Info("xDS: subscribing to rate-limit configs", "type", TypeURL)
	backoffs := 0 // consecutive stream ends since the last good response
	for {
		gotResponse, goodResponse, err := c.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wait time.Duration
		if gotResponse {
			if goodResponse {
				backoffs = 0
			}
			wait = c.backoff(backoffs)
			backoffs++
			c.failures = 0
			c.log.Warn("xDS: stream to the management server ended; the config in force stays, reconnecting", "err", errText(err), "retry_in", wait.Round(time.Millisecond).String())
		} else {
			wait = jitter(c.o.ConnectRetryInterval, 0.5)
			c.failures++
			msg := errText(err)
			// The first failure and then one a minute at warn (the
			// messages differ in ephemeral ports), the others at debug.
			if c.failures == 1 || time.Since(c.lastWarn) >= failureLogEvery {
				c.lastWarn = time.Now()
				args := []any{"err", msg, "attempts", c.failures, "retry_every", c.o.ConnectRetryInterval.String()}
				if c.o.TLS != nil && status.Code(err) == codes.Unavailable && !unreachable(msg) {
					args = append(args, "hint", "with TLS, a connection the server closes at once is most often a client certificate it refuses (not signed by a CA it trusts, expired) or a server certificate this client does not trust (CA, server name)")
				}
				c.log.Warn("xDS: cannot get a stream from the management server; no config from it until it answers (a config in force stays), retrying", args...)
			} else {
				c.log.Debug("xDS: connection attempt failed", "err", msg, "attempts", c.failures)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// unreachable reports whether a connection error says the server was not
// reached at all (no TLS handshake took place).
func unreachable(msg string) bool {
	for _, s := range []string{"connection refused", "no such host", "i/o timeout", "network is unreachable"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// backoff is the wait after the n-th consecutive stream end (n from 0).
func (c *client) backoff(n int) time.Duration {
	d := c.o.BackoffInitial
	for i := 0; i < n && d < c.o.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.o.BackoffMax)
	if !c.o.DisableBackoffJitter {
		d = jitter(d, c.o.BackoffRandomFactor)
	}
	return d
}

// jitter spreads d uniformly over [d(1-f), d(1+f)]; f is clamped to [0, 1]
// (NoBackoffSpread to 0: no spread).
func jitter(d time.Duration, f float64) time.Duration {
	f = max(0, min(f, 1))
	if f == 0 || d <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - f + 2*f*rand.Float64()))
}

func errText(err error) string {
	if err == nil {
		return "stream closed by the server"
	}
	return err.Error()
}

// stream runs one ADS stream until it fails. gotResponse says whether a
// response arrived (the stream was established), goodResponse whether one
// was ACKed.
func (c *client) stream(ctx context.Context) (gotResponse, goodResponse bool, err error) {
	creds := insecure.NewCredentials()
	if c.o.TLS != nil {
		tc, err := c.o.TLS()
		if err != nil {
			return false, false, err
		}
		creds = credentials.NewTLS(tc)
	}
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.o.MaxRecvMsgSize > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.o.MaxRecvMsgSize)))
	}
	conn, err := grpc.NewClient(c.o.ServerURL, dopts...)
	if err != nil {
		return false, false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(c.o.Headers))
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, false, err
	}
	node, err := c.node()
	if err != nil {
		return false, false, err
	}
	// The first request names the node and subscribes to every resource
	// of the type (no resource_names: wildcard), without a version.
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL}); err != nil {
		return false, false, recvErr(st, err)
	}
	acked := "" // version_info of the last ACKed response on this stream
	// rejected is the last NACKed response: go-control-plane's snapshot
	// cache answers a NACK (which names the last good version) with the
	// same snapshot at once, and would again after every NACK.
	var rejected struct {
		version string
		sum     [sha256.Size]byte
		detail  *rpcstatus.Status
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return gotResponse, goodResponse, err
		}
		if !gotResponse {
			gotResponse = true
			if c.failures > 0 {
				c.log.Info("xDS: management server answers again", "after_attempts", c.failures)
			}
			c.failures = 0
		}
		if resp.GetTypeUrl() != TypeURL {
			// Not subscribed to: another type on the aggregated stream.
			c.log.Debug("xDS: ignoring a response of another type", "type", resp.GetTypeUrl())
			continue
		}
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		sum := resourcesSum(resp)
		if rejected.detail != nil && resp.GetVersionInfo() == rejected.version && sum == rejected.sum {
			// The rejected config again, unchanged: not loaded, counted or
			// logged again. This NACK names the rejected version, so that
			// the server waits for a new snapshot instead of sending this
			// one back once more (a NACK loop).
			req.VersionInfo = rejected.version
			req.ErrorDetail = rejected.detail
			c.log.Debug("xDS: the rejected config was sent again; NACKed again, waiting for a new version", "version", resp.GetVersionInfo(), "nonce", resp.GetNonce())
		} else if set, warns, lerr := Load(c.o.Load, resp.GetResources()); lerr != nil {
			c.fail(fmt.Errorf("xDS version %q: %w", resp.GetVersionInfo(), lerr))
			req.VersionInfo = acked
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: truncate(lerr.Error(), maxErrorDetail)}
			rejected.version, rejected.sum, rejected.detail = resp.GetVersionInfo(), sum, req.ErrorDetail
			c.log.Warn("xDS: config NACKed", "version", resp.GetVersionInfo(), "nonce", resp.GetNonce(), "resources", len(resp.GetResources()), "kept_version", acked)
		} else {
			c.apply(set, warns)
			acked = resp.GetVersionInfo()
			req.VersionInfo = acked
			rejected.detail = nil
			goodResponse = true
			c.log.Info("xDS: config ACKed", "version", acked, "nonce", resp.GetNonce(), "resources", len(resp.GetResources()))
		}
		if err := st.Send(req); err != nil {
			return gotResponse, goodResponse, recvErr(st, err)
		}
	}
}

// resourcesSum is the SHA-256 of a response's resources in any order:
// of the sorted SHA-256 sums of each resource's type and bytes
// (go-control-plane sends a snapshot's resources in map order).
func resourcesSum(resp *discovery.DiscoveryResponse) [sha256.Size]byte {
	sums := make([][sha256.Size]byte, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		h := sha256.New()
		fmt.Fprintf(h, "%d:%s%d:", len(r.GetTypeUrl()), r.GetTypeUrl(), len(r.GetValue()))
		h.Write(r.GetValue())
		var one [sha256.Size]byte
		h.Sum(one[:0])
		sums = append(sums, one)
	}
	slices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, one := range sums {
		h.Write(one[:])
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// recvErr returns the stream's status after a failed Send (Send returns
// io.EOF; the reason is in Recv's error).
func recvErr(st grpc.ClientStream, sendErr error) error {
	var m discovery.DiscoveryResponse
	if err := st.RecvMsg(&m); err != nil {
		return err
	}
	return sendErr
}

// node is the core.v3.Node of every stream: id and metadata (string
// values), sorted by key for a stable request.
func (c *client) node() (*core.Node, error) {
	n := &core.Node{Id: c.o.NodeID}
	if len(c.o.NodeMetadata) > 0 {
		keys := make([]string, 0, len(c.o.NodeMetadata))
		for k := range c.o.NodeMetadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fields := make(map[string]any, len(keys))
		for _, k := range keys {
			fields[k] = c.o.NodeMetadata[k]
		}
		md, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, fmt.Errorf("xds: node metadata: %w", err)
		}
		n.Metadata = md
	}
	return n, nil
}

// truncate cuts s to at most n bytes on a rune boundary, saying so.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d more bytes)", len(s)-cut)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// ParseNodeMetadata parses CONFIG_GRPC_XDS_NODE_METADATA's format,
// "key=value,key2=value2" (the value may hold '='; spaces around items
// are trimmed). An item without '=' or with an empty key is an error
// naming its position (envoyproxy/ratelimit drops it silently).
func ParseNodeMetadata(s string) (map[string]string, error) {
	return parsePairs(s, "=")
}

// ParseHeaders parses CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS's format,
// "name:value,name2:value2" (envconfig's map syntax). An item without ':'
// or with an empty name is an error naming its position, never its value.
// Names are lower-cased (gRPC metadata keys are).
func ParseHeaders(s string) (map[string]string, error) {
	m, err := parsePairs(s, ":")
	if err != nil || m == nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out, nil
}

func parsePairs(s, sep string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, sep)
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("item %d is not key%svalue", i+1, sep)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}
