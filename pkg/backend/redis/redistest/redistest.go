// Package redistest starts real redis-server processes for tests: a
// standalone server (with options), a Redis Cluster, or a Sentinel
// deployment. Every process listens on a free loopback port, keeps its files
// in a t.TempDir and is killed by t.Cleanup; Kill, Stop, Cont and Restart
// simulate a crashed or frozen Redis. Without redis-server the helpers skip,
// or fail when RATELIMITD_REQUIRE_REDIS is set, so CI never skips silently.
// Only _test.go files import it.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure instead of a skip.
const RequireEnv = "RATELIMITD_REQUIRE_REDIS"

// StartTimeout bounds how long a helper waits for a process to accept
// commands (and, for clusters and sentinels, to converge).
const StartTimeout = 20 * time.Second

// Require skips (or, with RATELIMITD_REQUIRE_REDIS set, fails) t when
// redis-server or redis-cli is not on PATH. The other helpers call it.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("redistest: %s not on PATH (run scripts/ensure-redis.sh)", strings.Join(missing, ", "))
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s and %s is set", msg, RequireEnv)
	}
	t.Skip(msg)
}

// config collects the Options of one server.
type config struct {
	password      string
	user, userPW  string
	tls           bool
	tlsClientAuth bool
	tlsNames      []string // WithTLSServerNames
	maxmemory     string
	replicaOf     *Server
	cluster       bool
	extra         []string

	sentinels        int             // Sentinel: number of sentinels
	sentinelPassword string          // Sentinel: requirepass of sentinels
	sentinel         *sentinelConfig // set on a sentinel process
}

// Option configures a server started by Standalone, Cluster or Sentinel.
type Option func(*config)

// WithPassword sets requirepass (the "default" user's password). Replicas
// started with WithReplicaOf and sentinels use it as masterauth / auth-pass.
func WithPassword(pw string) Option { return func(c *config) { c.password = pw } }

// WithACLUser adds the ACL user `user on >pw ~* &* +@all`. The default user
// stays enabled (with WithPassword's password, if any) so that replication
// and the helpers' own probes keep working.
func WithACLUser(user, pw string) Option {
	return func(c *config) { c.user, c.userPW = user, pw }
}

// WithTLS makes the server listen with TLS only (tls-port, port 0), with a
// certificate for 127.0.0.1, ::1 and localhost signed by a CA generated for
// this server (see Server.TLS). Client certificates are optional.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithTLSServerNames is WithTLS with a server certificate issued for the
// DNS names given alone, not for 127.0.0.1, localhost or ::1: a client
// dialing Server.Addr that checks the name refuses it.
func WithTLSServerNames(names ...string) Option {
	return func(c *config) { c.tls, c.tlsNames = true, names }
}

// WithTLSClientAuth is WithTLS with client certificates required
// (tls-auth-clients yes): clients must present Server.TLS.ClientCertFile.
func WithTLSClientAuth() Option {
	return func(c *config) { c.tls, c.tlsClientAuth = true, true }
}

// WithMaxMemory sets maxmemory (a redis size such as "1mb") with
// maxmemory-policy noeviction, so writes past it fail with OOM.
func WithMaxMemory(size string) Option { return func(c *config) { c.maxmemory = size } }

// WithReplicaOf makes the server a read-only replica of master.
func WithReplicaOf(master *Server) Option { return func(c *config) { c.replicaOf = master } }

// WithArgs appends raw redis-server arguments ("--name", "value", ...).
func WithArgs(args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, args...) }
}

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	cfg  config
	dir  string
	port int
	// busPort is the cluster bus port (cluster mode only).
	busPort int
	// tls holds the generated certificate files when WithTLS was given.
	tls *TLSFiles

	proc testproc.Proc
	// Faults: Kill (clients see connection refused), Stop (SIGSTOP:
	// connections stay open, nothing is answered: a hung Redis), Cont.
	testproc.Faults
	args []string
}

// Standalone starts one redis-server with opts and returns it once it
// answers PING. The process is killed when the test ends.
func Standalone(t testing.TB, opts ...Option) *Server {
	t.Helper()
	Require(t)
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	s := newServer(t, cfg)
	s.startFresh()
	return s
}

// startFresh starts a new server and waits for it, picking other ports when
// the chosen one was taken between freePort and the server's bind.
func (s *Server) startFresh() {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		s.start()
		err := s.waitReadyErr()
		if err == nil {
			return
		}
		if errors.Is(err, testproc.ErrPortInUse) && attempt+1 < testproc.StartAttempts {
			s.port = testproc.FreePort(s.t)
			if s.cfg.cluster {
				s.busPort = testproc.FreePort(s.t)
			}
			s.args = s.buildArgs()
			_ = os.Remove(filepath.Join(s.dir, "redis.log"))
			_ = os.Remove(filepath.Join(s.dir, "stdout.log"))
			continue
		}
		s.t.Fatalf("%v", err)
	}
}

func newServer(t testing.TB, cfg config) *Server {
	t.Helper()
	s := &Server{t: t, cfg: cfg, dir: t.TempDir()}
	s.Faults = testproc.NewFaults(&s.proc)
	s.port = testproc.FreePort(t)
	if cfg.cluster {
		s.busPort = testproc.FreePort(t)
	}
	if cfg.tls {
		files, err := generateTLS(s.dir, cfg.tlsNames)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.tls = files
	}
	s.args = s.buildArgs()
	t.Cleanup(s.cleanup)
	return s
}

func (s *Server) buildArgs() []string {
	c := s.cfg
	if c.sentinel != nil {
		return s.sentinelArgs()
	}
	args := []string{
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--databases", "16",
	}
	if c.tls {
		args = append(args,
			"--port", "0",
			"--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tls.CertFile,
			"--tls-key-file", s.tls.KeyFile,
			"--tls-ca-cert-file", s.tls.CAFile,
		)
		if c.tlsClientAuth {
			args = append(args, "--tls-auth-clients", "yes")
		} else {
			args = append(args, "--tls-auth-clients", "optional")
		}
	} else {
		args = append(args, "--port", strconv.Itoa(s.port))
	}
	if c.password != "" {
		args = append(args, "--requirepass", c.password)
	}
	if c.user != "" {
		// A "user" directive needs a config file (the command line splits
		// it at spaces); the default user keeps its requirepass password.
		conf := filepath.Join(s.dir, "users.conf")
		line := fmt.Sprintf("user %s on >%s ~* &* +@all\n", c.user, c.userPW)
		if err := os.WriteFile(conf, []byte(line), 0o600); err != nil {
			s.t.Fatalf("redistest: %v", err)
		}
		args = append([]string{conf}, args...)
	}
	if c.maxmemory != "" {
		args = append(args, "--maxmemory", c.maxmemory, "--maxmemory-policy", "noeviction")
	}
	if m := c.replicaOf; m != nil {
		args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(m.port))
		if m.cfg.password != "" {
			args = append(args, "--masterauth", m.cfg.password)
		}
	}
	if c.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(s.busPort),
		)
		if c.password != "" {
			args = append(args, "--masterauth", c.password)
		}
	}
	return append(args, c.extra...)
}

// Addr is the server's "127.0.0.1:port" (the TLS port with WithTLS).
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's listening port.
func (s *Server) Port() int { return s.port }

// Dir is the server's working directory (redis.log, certificates, nodes.conf).
func (s *Server) Dir() string { return s.dir }

// TLS returns the generated certificate files, or nil without WithTLS.
func (s *Server) TLS() *TLSFiles { return s.tls }

// Password is the requirepass of the default user ("" when none).
func (s *Server) Password() string { return s.cfg.password }

// ACLUser returns the ACL user and password given with WithACLUser.
func (s *Server) ACLUser() (user, password string) { return s.cfg.user, s.cfg.userPW }

// URL is the server's redis:// (or rediss:// with WithTLS) URL for db 0,
// with the ACL user's credentials when WithACLUser was given, else the
// default user's password when WithPassword was given.
func (s *Server) URL() string {
	scheme := "redis"
	if s.cfg.tls {
		scheme = "rediss"
	}
	var auth string
	switch {
	case s.cfg.user != "":
		auth = s.cfg.user + ":" + s.cfg.userPW + "@"
	case s.cfg.password != "":
		auth = ":" + s.cfg.password + "@"
	}
	return fmt.Sprintf("%s://%s%s/0", scheme, auth, s.Addr())
}

// ClientOptions are go-redis options that reach this server as the default
// user (password, TLS with the generated CA and client certificate), with
// generous timeouts suitable for test setup and assertions.
func (s *Server) ClientOptions() *goredis.Options {
	o := &goredis.Options{
		Addr:         s.Addr(),
		Password:     s.cfg.password,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		MaxRetries:   -1,
		PoolSize:     4,
	}
	if s.tls != nil {
		o.TLSConfig = s.tls.ClientConfig()
	}
	return o
}

// Client returns a go-redis client for test setup and assertions (see
// ClientOptions); it is closed when the test ends.
func (s *Server) Client() *goredis.Client {
	c := goredis.NewClient(s.ClientOptions())
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Do runs one command on a fresh connection with the setup client options
// and returns its reply.
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := goredis.NewClient(s.ClientOptions())
	defer func() { _ = c.Close() }()
	return c.Do(ctx, args...).Result()
}

func (s *Server) start() {
	s.t.Helper()
	if err := s.proc.Start("redis-server", s.args, s.dir, filepath.Join(s.dir, "stdout.log")); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
}

// waitReady polls PING until the server answers (LOADING counts as not
// yet) and fails the test if it does not.
func (s *Server) waitReady() {
	s.t.Helper()
	if err := s.waitReadyErr(); err != nil {
		s.t.Fatalf("%v", err)
	}
}

func (s *Server) waitReadyErr() error {
	return s.proc.WaitReady("redistest: redis-server on "+s.Addr(), StartTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s.cfg.sentinel != nil {
			// Not in sentinel.conf: a sentinel takes it as a command only.
			_, err := s.Do(ctx, "SENTINEL", "DEBUG", "tilt-period", TiltPeriod.Milliseconds())
			return err
		}
		_, err := s.Do(ctx, "PING")
		return err
	}, func() string { return s.LogTail(30) })
}

// LogTail returns up to n last lines of the server's log and stdout.
func (s *Server) LogTail(n int) string {
	var b strings.Builder
	for _, name := range []string{"stdout.log", "redis.log"} {
		f, err := os.Open(filepath.Join(s.dir, name))
		if err != nil {
			continue
		}
		var lines []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) > n {
				lines = lines[1:]
			}
		}
		_ = f.Close()
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", name, s.Addr(), strings.Join(lines, "\n"))
	}
	return b.String()
}

// Restart kills the process (if alive) and starts it again on the same port
// with the same arguments and directory, waiting until it answers PING.
// Data is not persisted: the restarted server is empty (a cluster node
// keeps its nodes.conf, so its slots).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
	s.waitReady()
}

// Start starts a killed server again without waiting for it (Restart waits).
func (s *Server) Start() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// WaitReady waits until the server answers PING (after Start).
func (s *Server) WaitReady() { s.t.Helper(); s.waitReady() }

// Pid is the id of the server's current process (0 before it started).
func (s *Server) Pid() int { return s.proc.Pid() }

// Alive reports whether the process is running (possibly frozen).
func (s *Server) Alive() bool { return s.proc.Alive() }

func (s *Server) cleanup() {
	if s.t.Failed() {
		s.t.Logf("redistest: logs of failed test:\n%s", s.LogTail(20))
	}
	s.Kill()
}

// InfoInt is the integer field name ("name:123") of an INFO reply; the
// test fails when the field is missing or not an integer.
func InfoInt(t testing.TB, info, name string) int64 {
	t.Helper()
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("redistest: INFO %s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("redistest: INFO has no %s", name)
	return 0
}
