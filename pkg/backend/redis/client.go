package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// NewClient builds the go-redis client for o: a *goredis.Client
// (standalone), a *goredis.ClusterClient (cluster) or a failover
// *goredis.Client (sentinel). It validates o and reads the TLS files but
// never contacts Redis, so the service starts while Redis is down; the
// Store's Warm and health probe keep connections dialed.
//
// Pipelines share the main pool, so PoolSize bounds all connections to a
// node, and the connections warmed up are those a batch uses. The client
// speaks RESP2: the Store uses no push message, and over RESP3 go-redis
// would peek the socket for them before every command on a pinned
// connection. Every call is bounded by its context and Options.MaxWait and
// never retried by go-redis: a Cluster client follows MOVED and ASK (the
// node did not run the command) but re-sends nothing else (see
// noRetryHook); a connection that got READONLY is closed, so none
// stays on a demoted master. A Cluster client routes by hash slot alone and
// never asks a node for COMMAND, so a frozen node delays only the calls
// sent to it.
func NewClient(o Options) (goredis.UniversalClient, error) { return newClient(o, dialHooks{}) }

// newClient is NewClient whose dialer reports to hooks (see dialHooks).
func newClient(o Options, hooks dialHooks) (goredis.UniversalClient, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	base := &goredis.Options{}
	if o.URL != "" {
		var err error
		if err = CheckURL(o.URL, o.Mode == Standalone); err != nil {
			return nil, errors.New("redis: " + urlError(err))
		}
		if base, err = goredis.ParseURL(o.URL); err != nil {
			return nil, errors.New("redis: " + urlError(urlReason(err)))
		}
	}
	if o.Username != "" {
		base.Username = o.Username
	}
	if o.Password != "" {
		base.Password = o.Password
	}
	var creds func(context.Context) (string, string, error)
	if o.PasswordFile != "" {
		if _, err := readPasswordFile(o.PasswordFile); err != nil {
			return nil, err
		}
		user := base.Username
		creds = func(context.Context) (string, string, error) {
			p, err := readPasswordFile(o.PasswordFile)
			return user, p, err
		}
		base.Password = ""
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
	var onConnect func(context.Context, *goredis.Conn) error
	if hooks.login != nil {
		onConnect = hooks.login.onConnect
		if o.Mode == Sentinel { // the sentinels take other credentials
			hooks.ungated = map[string]bool{}
			for _, a := range o.Addrs {
				hooks.ungated[a] = true
			}
		}
	}
	dial := dialer(o.maxWait(), tlsCfg, hooks)
	maint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}

	switch o.Mode {
	case Cluster:
		cc := goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                      o.Addrs,
			Dialer:                     dial,
			Username:                   base.Username,
			Password:                   base.Password,
			CredentialsProviderContext: creds,
			OnConnect:                  onConnect,
			MaxRedirects:               3,
			MaxRetries:                 -1,
			DialTimeout:                o.maxWait(),
			DialerRetries:              1,
			ReadTimeout:                o.maxWait(),
			WriteTimeout:               o.maxWait(),
			ContextTimeoutEnabled:      true,
			PoolSize:                   o.PoolSize,
			PoolTimeout:                o.maxWait(),
			MinIdleConns:               0, // the Store keeps its connections warm (see dialer)
			ConnMaxIdleTime:            -1,
			PipelinePoolSize:           -1, // pipelines share each node's main pool (PoolSize, PoolTimeout)
			DisableIdentity:            true,
			MaintNotificationsConfig:   maint,
			Protocol:                   2, // see NewClient
			// go-redis' command routing policies look up every lone
			// command's COMMAND info, fetched on first use from a random
			// node under a lock the whole client shares: a frozen node
			// would hold every master's decisions for a read timeout. The
			// Store routes by slot only, which legacy routing does.
			DisableRoutingPolicies: true,
		})
		cc.AddHook(noRetryHook{})
		return cc, nil
	case Sentinel:
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:                 o.MasterName,
			SentinelAddrs:              o.Addrs,
			SentinelUsername:           o.SentinelUsername,
			SentinelPassword:           o.SentinelPassword,
			Dialer:                     dial,
			Username:                   base.Username,
			Password:                   base.Password,
			CredentialsProviderContext: creds,
			OnConnect:                  onConnect,
			DB:                         base.DB,
			MaxRetries:                 -1,
			DialTimeout:                o.maxWait(),
			DialerRetries:              1,
			ReadTimeout:                o.maxWait(),
			WriteTimeout:               o.maxWait(),
			ContextTimeoutEnabled:      true,
			PoolSize:                   o.PoolSize,
			PoolTimeout:                o.maxWait(),
			MinIdleConns:               0, // the Store keeps its connections warm (see dialer)
			ConnMaxIdleTime:            -1,
			PipelinePoolSize:           -1, // pipelines share the main pool (PoolSize, PoolTimeout)
			DisableIdentity:            true,
			Protocol:                   2, // see NewClient
		}), nil
	default:
		base.Dialer = dial
		base.CredentialsProviderContext = creds
		base.OnConnect = onConnect
		base.TLSConfig = nil // TLS is done by dial, bounded by the context
		base.MaxRetries = -1
		base.DialTimeout = o.maxWait()
		base.DialerRetries = 1
		base.ReadTimeout = o.maxWait()
		base.WriteTimeout = o.maxWait()
		base.ContextTimeoutEnabled = true
		base.PoolSize = o.PoolSize
		base.PoolTimeout = o.maxWait()
		base.MinIdleConns = 0 // the Store keeps its connections warm (see dialer)
		base.ConnMaxIdleTime = -1
		base.PipelinePoolSize = -1 // pipelines share the main pool (PoolSize, PoolTimeout)
		base.DisableIdentity = true
		base.MaintNotificationsConfig = maint
		base.Protocol = 2 // see NewClient
		return goredis.NewClient(base), nil
	}
}

// noRetryHook marks every command a Cluster client sends as not to be
// retried. go-redis' Cluster layer retries, up to MaxRedirects times, a
// command or pipeline that timed out or lost its connection, whatever
// MaxRetries says; the node may have run it already, and a script run
// twice counts a decision twice. Marked commands still follow MOVED and
// ASK redirections, which the node answers without running the command.
// Other refusals (TRYAGAIN, CLUSTERDOWN, LOADING) fail the call at once
// and the rules' failure modes answer. A MULTI/EXEC pipeline, which the
// Store does not send, passes unmarked: go-redis reads its replies by
// command type.
type noRetryHook struct{}

func (noRetryHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (noRetryHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return next(ctx, noRetryCmd{cmd})
	}
}

func (noRetryHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			return next(ctx, cmds)
		}
		marked := make([]goredis.Cmder, len(cmds))
		wrapped := make([]noRetryCmd, len(cmds))
		for i, c := range cmds {
			wrapped[i].Cmder = c
			marked[i] = &wrapped[i]
		}
		return next(ctx, marked)
	}
}

// noRetryCmd is a command go-redis must not retry: it is the embedded
// command (its arguments, reply and error) but for NoRetry.
type noRetryCmd struct{ goredis.Cmder }

// NoRetry is true: see noRetryHook.
func (noRetryCmd) NoRetry() bool { return true }

// maxWait is the client's own bound of a command (read, write, pool wait)
// when its context has an earlier deadline or none: Options.MaxWait, or
// Timeout when that is longer. It also bounds each dial, which go-redis
// runs detached from the call that needs it: a shorter bound would fail
// calls whose budget still had room on a slow network, and a dial that
// outlives its call gives the pool a connection for the next one.
func (o Options) maxWait() time.Duration { return max(o.MaxWait, o.Timeout) }

// dialer dials TCP, then TLS when cfg is set, both bounded by the caller's
// context (go-redis' own TLS dialing ignores it) and by timeout. A TLS
// connection is returned as an opaqueTLSConn.
//
// A failed dial is returned as a failedConn that fails the connection's
// first command, not as an error: once dial errors reach PoolSize,
// go-redis' pool redials only once a second, which would keep a restarted
// Redis unused for up to a second; the circuit breaker already prevents a
// reconnect storm. So that no failedConn waits idle in the pool, go-redis'
// MinIdleConns is 0. hooks observe the dials (see dialHooks).
func dialer(timeout time.Duration, cfg *tls.Config, hooks dialHooks) func(context.Context, string, string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := raw.(*net.TCPConn); ok && hooks.wrap != nil {
			raw = hooks.wrap(addr, tc)
		}
		if cfg == nil {
			return raw, nil
		}
		c := cfg
		if c.ServerName == "" { // as tls.Dialer does
			c = cfg.Clone()
			if host, _, err := net.SplitHostPort(addr); err == nil {
				c.ServerName = host
			}
		}
		tc := tls.Client(raw, c)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		oc := &opaqueTLSConn{Conn: tc, tls: tc}
		if sc, ok := raw.(syscall.Conn); ok {
			oc.raw, _ = sc.SyscallConn()
		}
		return oc, nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if hooks.login != nil && !hooks.ungated[addr] {
			if err := hooks.login.dial(); err != nil {
				return failedConn{err: err, addr: addr}, nil
			}
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			logDialFailure(ctx, addr, err)
			return failedConn{err: err, addr: addr}, nil
		}
		if hooks.watch != nil {
			hooks.watch(addr)
		}
		return c, nil
	}
}

// dialHooks are the Store's observers of its client's dials: watch is told
// every address dialed successfully (the Sentinel master watch), and wrap
// gets every TCP socket and returns the connection to use over it (TLS
// runs on top; see liveness). login, when set, is asked before every dial
// but those to the ungated addresses (the sentinels) and told of every
// connection set up (see loginGate). Any may be nil.
type dialHooks struct {
	watch   func(addr string)
	wrap    func(addr string, c *net.TCPConn) net.Conn
	login   *loginGate
	ungated map[string]bool
}

// failedConn is a connection whose dial failed with err: every read and
// write returns err (see dialer).
type failedConn struct {
	err  error
	addr string
}

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return failedAddr("") }
func (c failedConn) RemoteAddr() net.Addr             { return failedAddr(c.addr) }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }

// failedAddr is a failedConn's address ("tcp", the address dialed).
type failedAddr string

func (a failedAddr) Network() string { return "tcp" }
func (a failedAddr) String() string  { return string(a) }

// opaqueTLSConn is a client *tls.Conn that does not expose its TCP socket:
// it has net.Conn's methods and ConnectionState, no NetConn, and a
// SyscallConn that only tells whether the server closed the socket
// (eofOnlyConn), so go-redis treats it as an opaque transport.
//
// Over RESP3 go-redis peeks the socket beneath TLS for push frames before
// a command on a new or long-unused connection. After a TLS 1.3 handshake
// it finds the server's session tickets there and waits out a fixed 50 ms
// read that ignores the context, so with a short Timeout every HELLO
// fails. Hiding the socket removes that peek; crypto/tls reads the tickets
// with the first reply.
type opaqueTLSConn struct {
	net.Conn // the *tls.Conn; an interface field promotes only net.Conn's methods
	tls      *tls.Conn
	raw      syscall.RawConn // the TCP socket beneath TLS (nil: unknown)
}

// SyscallConn gives go-redis' socket checks (the pool's health check of an
// idle connection, the push-frame peek) a view of the socket beneath TLS
// that tells only whether the server closed it (eofOnlyConn), so that a
// pooled connection to a restarted Redis is found dead before a request
// uses it.
func (c *opaqueTLSConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, errors.New("redis: no socket beneath this TLS connection")
	}
	return eofOnlyConn{c.raw}, nil
}

// eofOnlyConn is a syscall.RawConn whose Read, instead of running the
// caller's function on the socket, peeks it without blocking and fails
// with io.EOF when the server closed it; bytes waiting (TLS records such
// as TLS 1.3 session tickets, which only crypto/tls may read) and an empty
// socket both answer nil.
type eofOnlyConn struct{ rc syscall.RawConn }

func (e eofOnlyConn) Control(f func(fd uintptr)) error { return e.rc.Control(f) }

func (e eofOnlyConn) Read(func(fd uintptr) bool) error {
	closed := false
	if err := e.rc.Control(func(fd uintptr) { closed = peerClosed(fd) }); err != nil {
		return err
	}
	if closed {
		return io.EOF
	}
	return nil
}

func (e eofOnlyConn) Write(func(fd uintptr) bool) error { return nil }

// ConnectionState returns the TLS state (negotiated version, peer
// certificates) of the connection.
func (c *opaqueTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// tlsConfig builds the client TLS configuration (TLS 1.2 minimum).
// serverName "" lets each dial verify the dialed host (cluster nodes,
// sentinels, the current master). With TLSSkipHostname (and not
// TLSSkipVerify) crypto/tls' own verification is off and
// verifyChainOnly does it without the name check.
func (o Options) tlsConfig(serverName string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         serverName,
		InsecureSkipVerify: o.TLSSkipVerify || o.TLSSkipHostname, //nolint:gosec // opt-in; TLSSkipHostname still verifies the chain (verifyChainOnly)
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
	if o.TLSSkipHostname && !o.TLSSkipVerify {
		roots := cfg.RootCAs
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyChainOnly(cs.PeerCertificates, roots)
		}
	}
	return cfg, nil
}

// verifyChainOnly verifies the server's certificate chain as crypto/tls
// does (roots, or the system roots when nil; the intermediates the server
// sent; valid now for server authentication) but without checking the
// name it was issued for. A failure is a *tls.CertificateVerificationError,
// as crypto/tls reports its own (cause auth).
func verifyChainOnly(certs []*x509.Certificate, roots *x509.CertPool) error {
	if len(certs) == 0 {
		return &tls.CertificateVerificationError{Err: errors.New("the server sent no certificate")}
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
	}
	return nil
}

// logger receives the Store's own client log lines (dial failures), like
// go-redis' internal ones; see SetLogger.
var logger atomic.Pointer[Logger]

// Logger is go-redis' internal logging interface.
type Logger interface {
	// Printf logs one line formatted as fmt.Sprintf(format, v...); ctx is
	// that of the operation logged (a dial, a failover watch), possibly
	// context.Background().
	Printf(ctx context.Context, format string, v ...any)
}

// SetLogger routes go-redis' internal log lines and this package's own
// (a failed dial: "redis: dial <addr>: <error>") to l.
func SetLogger(l Logger) {
	goredis.SetLogger(l)
	logger.Store(&l)
}

func logDialFailure(ctx context.Context, addr string, err error) {
	if l := logger.Load(); l != nil {
		(*l).Printf(ctx, "redis: dial %s: %v", addr, err)
	}
}

// maxPasswordFileBytes bounds a password file (Options.PasswordFile).
const maxPasswordFileBytes = 64 << 10

// readPasswordFile returns the password in path without one trailing
// newline (LF or CRLF). Errors name the file, never its content.
func readPasswordFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("redis: password file: %w", err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxPasswordFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("redis: password file: %w", err)
	}
	if len(b) > maxPasswordFileBytes {
		return "", fmt.Errorf("redis: password file %s: larger than %d bytes", path, maxPasswordFileBytes)
	}
	p := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if p == "" {
		return "", fmt.Errorf("redis: password file %s is empty", path)
	}
	if strings.ContainsAny(p, "\r\n") {
		return "", fmt.Errorf("redis: password file %s holds more than one line; it should hold only the password", path)
	}
	return p, nil
}
