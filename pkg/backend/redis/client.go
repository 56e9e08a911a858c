package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// NewClient builds the go-redis client for o: a *goredis.Client
// (standalone), a *goredis.ClusterClient (cluster) or a failover
// *goredis.Client (sentinel). It validates o and reads the TLS files but
// never contacts Redis: connections are dialed lazily (and MinIdleConns in
// the background), so the service starts while Redis is down.
//
// Pipelines (the Store's batches) run on the main pool, not on go-redis'
// separate pipeline pool: PoolSize bounds all connections to a node.
//
// Every call is bounded by its context's deadline (connection-pool wait,
// dial, TLS handshake, write and read; the Store gives each invocation the
// latest budget of its calls) and by Options.MaxWait, and is never retried
// by go-redis; the circuit breaker (Breaker) stops calls from waiting on a
// Redis that stopped answering. Cluster MOVED/ASK redirections are still followed (up to
// 3). A connection that got a READONLY reply is closed by go-redis, and
// the Sentinel client re-resolves the master on every new connection and on
// the sentinels' +switch-master, so no connection stays stuck on a demoted
// master.
func NewClient(o Options) (goredis.UniversalClient, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	base := &goredis.Options{}
	if o.URL != "" {
		var err error
		if base, err = goredis.ParseURL(o.URL); err != nil {
			return nil, fmt.Errorf("redis: url %q: %w", redactURL(o.URL), err)
		}
	}
	if o.Username != "" {
		base.Username = o.Username
	}
	if o.Password != "" {
		base.Password = o.Password
	}
	var tlsCfg *tls.Config
	if o.TLS || base.TLSConfig != nil {
		var err error
		serverName := ""
		if o.Mode == Standalone && base.TLSConfig != nil {
			serverName = base.TLSConfig.ServerName
		}
		if tlsCfg, err = o.tlsConfig(serverName); err != nil {
			return nil, err
		}
	}
	dial := dialer(o.DialTimeout, tlsCfg)
	maint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}

	switch o.Mode {
	case Cluster:
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                    o.Addrs,
			Dialer:                   dial,
			Username:                 base.Username,
			Password:                 base.Password,
			MaxRedirects:             3,
			MaxRetries:               -1,
			DialTimeout:              o.DialTimeout,
			DialerRetries:            1,
			ReadTimeout:              o.maxWait(),
			WriteTimeout:             o.maxWait(),
			ContextTimeoutEnabled:    true,
			PoolSize:                 o.PoolSize,
			PoolTimeout:              o.maxWait(),
			MinIdleConns:             o.MinIdleConns,
			DisableIdentity:          true,
			MaintNotificationsConfig: maint,
		}), nil
	case Sentinel:
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            o.MasterName,
			SentinelAddrs:         o.Addrs,
			SentinelUsername:      o.SentinelUsername,
			SentinelPassword:      o.SentinelPassword,
			Dialer:                dial,
			Username:              base.Username,
			Password:              base.Password,
			DB:                    base.DB,
			MaxRetries:            -1,
			DialTimeout:           o.DialTimeout,
			DialerRetries:         1,
			ReadTimeout:           o.maxWait(),
			WriteTimeout:          o.maxWait(),
			ContextTimeoutEnabled: true,
			PoolSize:              o.PoolSize,
			PoolTimeout:           o.maxWait(),
			MinIdleConns:          o.MinIdleConns,
			PipelinePoolSize:      -1, // pipelines share the main pool (PoolSize, PoolTimeout)
			DisableIdentity:       true,
		}), nil
	default:
		base.Dialer = dial
		base.TLSConfig = nil // TLS is done by dial, bounded by the context
		base.MaxRetries = -1
		base.DialTimeout = o.DialTimeout
		base.DialerRetries = 1
		base.ReadTimeout = o.maxWait()
		base.WriteTimeout = o.maxWait()
		base.ContextTimeoutEnabled = true
		base.PoolSize = o.PoolSize
		base.PoolTimeout = o.maxWait()
		base.MinIdleConns = o.MinIdleConns
		base.PipelinePoolSize = -1 // pipelines share the main pool (PoolSize, PoolTimeout)
		base.DisableIdentity = true
		base.MaintNotificationsConfig = maint
		return goredis.NewClient(base), nil
	}
}

// maxWait is the client's own bound of a command (read, write, pool wait)
// when its context has an earlier deadline or none: Options.MaxWait, or
// Timeout when that is longer.
func (o Options) maxWait() time.Duration { return max(o.MaxWait, o.Timeout) }

// dialer dials TCP, then TLS when cfg is set, both bounded by the caller's
// context and by timeout. (go-redis' own TLS dialing ignores the context.)
// A TLS connection is returned as an opaqueTLSConn (see there for why).
func dialer(timeout time.Duration, cfg *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if cfg == nil {
		return nd.DialContext
	}
	td := &tls.Dialer{NetDialer: nd, Config: cfg}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := td.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &opaqueTLSConn{Conn: c, tls: c.(*tls.Conn)}, nil
	}
}

// opaqueTLSConn is a client *tls.Conn that does not expose its TCP socket:
// it has net.Conn's methods and ConnectionState, but neither NetConn nor
// SyscallConn, so go-redis treats it as an opaque transport.
//
// Why: over RESP3, before a command on a connection that was not put back
// into the pool in the last 5 s (so on every new connection, starting
// with its HELLO), go-redis looks for pending push frames by peeking the
// socket beneath TLS (it unwraps NetConn). After a TLS 1.3 handshake that
// socket holds the server's NewSessionTicket messages: OpenSSL, and so
// redis-server, sends two after every handshake, even though this client
// offers no session resumption (no ClientSessionCache; setting
// tls.Config.SessionTicketsDisabled changes nothing on the wire) and even
// with tls-session-caching no. Seeing readable bytes, go-redis reads for a
// push frame with a fixed 50 ms read deadline that ignores the context;
// crypto/tls consumes the tickets and then waits for application data
// that never comes. With the default 10 ms Timeout the HELLO then misses
// its deadline, go-redis discards the connection, the pool dials a new
// one, and that one fails the same way: no call ever succeeds. (TLS 1.2
// sends its ticket inside the handshake, so only TLS 1.3 is affected.)
//
// Hiding the socket removes that peek. The tickets stay in the kernel
// buffer until the first reply is read, and crypto/tls consumes them then,
// at no cost. Nothing else is lost: go-redis still reads RESP3 push frames
// that precede a reply (the Store subscribes to none: no tracking, no
// pub/sub, maintenance notifications off), and its pool health check never
// looks beneath TLS anyway. Reading the tickets in the dialer instead
// would cost every dial a wait or a round trip, since the server chooses
// when and how many it sends.
type opaqueTLSConn struct {
	net.Conn // the *tls.Conn; an interface field promotes only net.Conn's methods
	tls      *tls.Conn
}

// ConnectionState returns the TLS state (negotiated version, peer
// certificates) of the connection.
func (c *opaqueTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// tlsConfig builds the client TLS configuration (TLS 1.2 minimum).
// serverName "" lets each dial verify the dialed host (cluster nodes,
// sentinels, the current master).
func (o Options) tlsConfig(serverName string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         serverName,
		InsecureSkipVerify: o.TLSSkipVerify, //nolint:gosec // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, opt-in
	}
	if o.TLSCAFile != "" {
		pem, err := os.ReadFile(o.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("redis: tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis: tls ca %s: no PEM certificate found", o.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if o.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis: tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
