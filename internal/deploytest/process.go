package deploytest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
)

// FreeAddr is a loopback TCP address ("127.0.0.1:port") that was free a
// moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testproc.FreePort(t)))
}

// FreePorts is n distinct loopback ports, as strings for flags and
// addresses, that were free a moment ago.
func FreePorts(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for _, p := range testproc.FreePorts(t, n) {
		out = append(out, strconv.Itoa(p))
	}
	return out
}

// SyncBuffer collects a process's output (testproc.Buffer: safe for
// concurrent use; the zero value is empty and ready).
type SyncBuffer = testproc.Buffer

// Listening is a "listening" record of ratelimitd's JSON log.
type Listening struct {
	Server string // "grpc", "http", "debug" or "metrics"
	Addr   string // the bound "host:port"
}

// ScanLog reads r, a ratelimitd's stderr with --log-format=json, to its
// end: every line is appended to log, and every "listening" record is
// sent on listening (which must have room or be read). Lines up to 1 MiB.
func ScanLog(r io.Reader, log *SyncBuffer, listening chan<- Listening) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = log.Write([]byte(line + "\n"))
		var rec struct{ Msg, Server, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
			listening <- Listening{Server: rec.Server, Addr: rec.Addr}
		}
	}
}

// Process is a command started by Start.
type Process struct {
	// Log is the command's stdout and stderr.
	Log  *SyncBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts cmd with its stdout and stderr in Log and stops it when t
// ends: os.Interrupt, then a kill when it has not exited within grace.
func Start(t testing.TB, cmd *exec.Cmd, grace time.Duration) *Process {
	t.Helper()
	p := &Process{Log: &SyncBuffer{}, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// WaitOK polls GET url every 100 ms until it answers 200. It fails t,
// with the last error and the log, when the process exits first or when
// within passes.
func (p *Process) WaitOK(t testing.TB, url string, within time.Duration) {
	t.Helper()
	if err := p.WaitUp(within, GetOK(url)); err != nil {
		t.Fatal(err)
	}
}

// GetOK is a check for WaitUp: GET url answers 200.
func GetOK(url string) func() error {
	return func() error {
		resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
		}
		return nil
	}
}

// Logged is a check for WaitUp: the log has a line containing s (for
// ratelimitd, "listening": it binds every listener before logging any).
func (p *Process) Logged(s string) func() error {
	return func() error {
		if !strings.Contains(p.Log.String(), s) {
			return fmt.Errorf("no %q in the log yet", s)
		}
		return nil
	}
}

// WaitUp polls up every 100 ms until it returns nil. It returns an error
// with the log when the process exits first (wrapping
// testproc.ErrPortInUse when the log says a bind failed, for
// testproc.StartRetrying), or with up's last error when within passes.
func (p *Process) WaitUp(within time.Duration, up func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := up()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			if testproc.PortInUse(p.Log.String()) {
				return fmt.Errorf("%q exited during startup: %w\n%s", p.cmd.Args, testproc.ErrPortInUse, p.Log)
			}
			return fmt.Errorf("%q exited during startup (last check: %v):\n%s", p.cmd.Args, err, p.Log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%q not up within %v (last check: %v):\n%s", p.cmd.Args, within, err, p.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
