// Package pgtest starts throwaway PostgreSQL clusters for tests: initdb
// in a t.TempDir, one postgres process on a free loopback port with a
// password for TCP connections, killed by t.Cleanup. When the test runs
// as root, the cluster belongs to the postgres user (created when
// missing), as initdb and postgres refuse to run as root.
//
// When initdb or postgres cannot be found (on PATH or under
// /usr/lib/postgresql/*/bin) or the cluster does not start, the helpers
// call t.Skip, unless RATELIMITD_REQUIRE_POSTGRES or
// RATELIMITD_REQUIRE_REDIS is set (as `make test` sets both): then they
// fail the test. The package is test support, imported by _test.go files
// only.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// RequireEnv turns a missing or failing PostgreSQL into a test failure;
// RATELIMITD_REQUIRE_REDIS (redistest.RequireEnv) does too.
const RequireEnv = "RATELIMITD_REQUIRE_POSTGRES"

// StartTimeout bounds initdb and the wait for the server to accept
// connections.
const StartTimeout = 60 * time.Second

// User is the database user the helpers create; its password is
// Server.Password.
const User = "ratelimitd"

// required reports whether a missing PostgreSQL fails the test.
func required() bool {
	return os.Getenv(RequireEnv) != "" || os.Getenv("RATELIMITD_REQUIRE_REDIS") != ""
}

// unavailable skips t, or fails it when PostgreSQL is required.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := "pgtest: " + fmt.Sprintf(format, args...)
	if required() {
		t.Fatalf("%s (run scripts/ensure-postgres.sh)", msg)
	}
	t.Skip(msg)
}

// BinDir is the directory holding initdb and postgres: the one of initdb
// on PATH, or the newest /usr/lib/postgresql/*/bin; "" when none.
func BinDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestV := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil && v > bestV {
			best, bestV = d, v
		}
	}
	return best
}

// Server is one PostgreSQL cluster and its postgres process.
type Server struct {
	t        testing.TB
	bin, dir string
	port     int
	// Password is User's password (random per server).
	Password string
	proc     testproc.Proc
	fsync    bool
}

// Option configures Start.
type Option func(*Server)

// WithFsync keeps fsync and full_page_writes on (the default of a real
// server); without it the cluster runs with both off, for speed. A commit
// survives a killed postgres either way (its WAL is written before the
// commit returns, to the page cache at least); only an OS crash could
// lose it without fsync.
func WithFsync() Option { return func(s *Server) { s.fsync = true } }

// Start creates a cluster and starts postgres; it returns once the
// server accepts connections. The process is killed when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := BinDir()
	if bin == "" {
		unavailable(t, "initdb not found on PATH nor under /usr/lib/postgresql/*/bin")
	}
	s := &Server{t: t, bin: bin, Password: randomHex(12)}
	for _, o := range opts {
		o(s)
	}
	base := t.TempDir()
	s.dir = filepath.Join(base, "data")
	pwfile := filepath.Join(base, "pw")
	if err := os.WriteFile(pwfile, []byte(s.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cred, err := runAs(base)
	if err != nil {
		unavailable(t, "%v", err)
	}
	s.proc.Prepare = cred
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.dir, "-U", User, "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "-N")
	testproc.KillWithParent(initdb)
	cred(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		unavailable(t, "initdb: %v\n%s", err, out)
	}
	_ = os.Remove(pwfile)
	t.Cleanup(s.Kill)
	for attempt := 0; ; attempt++ {
		s.port = testproc.FreePort(t)
		s.start()
		err := s.waitReady()
		if err == nil {
			return s
		}
		if errors.Is(err, testproc.ErrPortInUse) && attempt+1 < testproc.StartAttempts {
			continue
		}
		unavailable(t, "%v", err)
	}
}

func (s *Server) start() {
	args := []string{"-D", s.dir, "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "shared_buffers=32MB"}
	if !s.fsync {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	if err := s.proc.Start(filepath.Join(s.bin, "postgres"), args, s.dir, s.logPath()); err != nil {
		s.t.Fatalf("pgtest: start postgres: %v", err)
	}
}

func (s *Server) logPath() string { return filepath.Join(filepath.Dir(s.dir), "postgres.log") }

func (s *Server) waitReady() error {
	return s.proc.WaitReady("postgres on "+s.Addr(), StartTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			return err
		}
		return c.Close(ctx)
	}, s.logTail)
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath())
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Addr is the server's "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is a postgres:// URL of database db as User, with the password.
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(User, s.Password), Host: s.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// URLNoPassword is URL without the password (to pass it on its own).
func (s *Server) URLNoPassword(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(User), Host: s.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDB creates a fresh database and returns its name.
func (s *Server) CreateDB(t testing.TB) string {
	t.Helper()
	name := "t_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return name
}

// Exec runs sql on database db (a test's look at the rows).
func (s *Server) Exec(t testing.TB, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL(db))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// QueryInt runs sql on database db and returns its one int64 value.
func (s *Server) QueryInt(t testing.TB, db, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL(db))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	var v int64
	if err := c.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
	return v
}

// Kill kills postgres and its backends (SIGKILL) and waits until they
// are gone: clients then see connection refused.
func (s *Server) Kill() {
	if pid := s.proc.Pid(); pid != 0 && s.proc.Alive() {
		pids := tree(pid)
		signalAll(pids, syscall.SIGKILL)
		s.proc.Kill()
		waitGone(pids)
	}
}

// Stop freezes postgres and its backends (SIGSTOP; the postmaster first,
// so that it forks no new one): connections stay open and new ones are
// accepted by the kernel, but nothing is answered (a hung server).
func (s *Server) Stop() {
	if pid := s.proc.Pid(); pid != 0 {
		s.proc.Stop()
		pids := tree(pid)
		signalAll(pids, syscall.SIGSTOP)
		waitStopped(pids)
	}
}

// Cont resumes a server frozen by Stop.
func (s *Server) Cont() {
	if pid := s.proc.Pid(); pid != 0 {
		signalAll(tree(pid), syscall.SIGCONT)
		s.proc.Cont()
	}
}

// Restart kills postgres when it runs and starts it again (same port and
// data, crash recovery included); it returns once the server accepts
// connections.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
	if err := s.waitReady(); err != nil {
		s.t.Fatalf("pgtest: restart: %v", err)
	}
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath())
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
