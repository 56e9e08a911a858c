// Package runner stands in for envoyproxy/ratelimit's
// src/service_cmd/runner in that project's own integration suite, so that
// the suite tests the ratelimitd binary instead of the reference's
// in-process server. scripts/refsuite.sh rewrites the suite's import of
// the reference package to this one.
//
// Run renders the suite's settings.Settings as the reference's environment
// variables (env.go) and runs the binary named by RATELIMITD_BIN with them,
// its gRPC listener on a private loopback port behind a byte-for-byte TCP
// proxy on the port the suite dials (proxy.go). GetStatsStore returns a
// gostats.Store fed by ratelimitd's statsd stats (stats.go).
//
// Environment of the test process:
//
//	RATELIMITD_BIN                  path of the ratelimitd binary (required)
//	RATELIMITD_ARGS                 its arguments, space-separated (default "serve")
//	REFSUITE_STATS_FLUSH_INTERVAL   STATS_FLUSH_INTERVAL given to ratelimitd (default 5ms)
//	REFSUITE_READY_TIMEOUT          how long Run waits for the gRPC port (default 20s)
package runner

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gostats "github.com/lyft/gostats"

	"github.com/envoyproxy/ratelimit/src/settings"
)

// Runner has the methods of the reference's runner.Runner that the suite
// calls. It is a value (NewRunner returns one, the suite takes its
// address); its state is shared by copies.
type Runner struct {
	st *state
}

type state struct {
	settings settings.Settings
	stats    *statsStore
	interval time.Duration

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd exited
	proxy   *proxy
	stopped bool
}

// NewRunner prepares a run of ratelimitd with s; it starts nothing but the
// statsd listener.
func NewRunner(s settings.Settings) Runner {
	interval := envDuration("REFSUITE_STATS_FLUSH_INTERVAL", 5*time.Millisecond)
	st, err := newStatsStore(interval)
	if err != nil {
		panic(fmt.Sprintf("refsuite runner: statsd listener: %v", err))
	}
	return Runner{st: &state{settings: s, stats: st, interval: interval, exited: make(chan struct{})}}
}

// GetStatsStore returns the store fed by ratelimitd's statsd stats.
func (r *Runner) GetStatsStore() gostats.Store { return r.st.stats }

// Run starts ratelimitd, waits until it serves, opens the suite's gRPC port
// and returns when ratelimitd exited (after Stop, or on its own).
func (r *Runner) Run() {
	st := r.st
	s := st.settings
	bin := os.Getenv("RATELIMITD_BIN")
	if bin == "" {
		panic("refsuite runner: RATELIMITD_BIN is not set")
	}
	env, err := settingsEnv(s)
	if err != nil {
		panic("refsuite runner: " + err.Error())
	}
	backendPort, err := freePort()
	if err != nil {
		panic("refsuite runner: " + err.Error())
	}
	env = setEnv(env, "GRPC_HOST", "127.0.0.1")
	env = setEnv(env, "GRPC_PORT", strconv.Itoa(backendPort))
	if s.DisableStats {
		st.stats.disable()
	} else {
		env = setEnv(env, "USE_STATSD", "true")
		env = setEnv(env, "STATSD_HOST", "127.0.0.1")
		env = setEnv(env, "STATSD_PORT", strconv.Itoa(st.stats.port()))
		env = setEnv(env, "STATS_FLUSH_INTERVAL", st.interval.String())
	}
	ref := referenceNames()
	var childEnv []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !ref[name] {
			childEnv = append(childEnv, kv)
		}
	}
	childEnv = append(childEnv, env...)

	args := strings.Fields(os.Getenv("RATELIMITD_ARGS"))
	if len(args) == 0 {
		args = []string{"serve"}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	// The child dies with the test binary (a panicking test must not leave
	// ratelimitd holding the suite's ports).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	st.mu.Lock()
	if st.stopped {
		st.mu.Unlock()
		return
	}
	if err := cmd.Start(); err != nil {
		st.mu.Unlock()
		panic(fmt.Sprintf("refsuite runner: start %s: %v", bin, err))
	}
	st.cmd = cmd
	st.mu.Unlock()
	log.Printf("refsuite runner: started ratelimitd (pid %d) with %s", cmd.Process.Pid, strings.Join(redact(env), " "))
	go func() {
		err := cmd.Wait()
		log.Printf("refsuite runner: ratelimitd (pid %d) exited: %v", cmd.Process.Pid, errOrOK(err))
		st.stats.disable()
		close(st.exited)
	}()

	backend := net.JoinHostPort("127.0.0.1", strconv.Itoa(backendPort))
	if !st.waitListening(backend, envDuration("REFSUITE_READY_TIMEOUT", 20*time.Second)) {
		log.Printf("refsuite runner: ratelimitd is not listening on %s", backend)
		<-st.exited
		return
	}
	if !s.DisableStats {
		st.waitConfigLoad(10*time.Second, s.ExtraTags)
	}
	p, err := newProxy(net.JoinHostPort(s.GrpcHost, strconv.Itoa(s.GrpcPort)), backend, st.stats.markTraffic)
	if err != nil {
		log.Printf("refsuite runner: gRPC port: %v", err)
		_ = cmd.Process.Kill()
		<-st.exited
		return
	}
	st.mu.Lock()
	if st.stopped {
		st.mu.Unlock()
		p.close()
	} else {
		st.proxy = p
		st.mu.Unlock()
	}
	<-st.exited
}

// waitListening reports whether addr accepted a TCP connection before the
// timeout or ratelimitd's exit.
func (st *state) waitListening(addr string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return true
		}
		select {
		case <-st.exited:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// waitConfigLoad waits until ratelimitd reported its first config load
// (success or error): the reference loads its config before it listens,
// and the suite sends its first request as soon as the port accepts. The
// names carry EXTRA_TAGS (tags), as ratelimitd sends them.
func (st *state) waitConfigLoad(timeout time.Duration, tags map[string]string) {
	deadline := time.Now().Add(timeout)
	ok := st.stats.values.NewCounterWithTags("ratelimit.service.config_load_success", tags)
	bad := st.stats.values.NewCounterWithTags("ratelimit.service.config_load_error", tags)
	for time.Now().Before(deadline) {
		if ok.Value()+bad.Value() > 0 {
			return
		}
		select {
		case <-st.exited:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	log.Printf("refsuite runner: no config_load_success or config_load_error within %s", timeout)
}

// Stop closes the suite's gRPC port, stops ratelimitd (SIGTERM, SIGKILL
// after 10s) and waits for it to exit, so that its ports are free.
func (r *Runner) Stop() {
	st := r.st
	st.mu.Lock()
	st.stopped = true
	p, cmd := st.proxy, st.cmd
	st.mu.Unlock()
	if p != nil {
		p.close()
	}
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-st.exited:
		case <-time.After(10 * time.Second):
			log.Printf("refsuite runner: ratelimitd (pid %d) still running 10s after SIGTERM; killing it", cmd.Process.Pid)
			_ = cmd.Process.Kill()
			<-st.exited
		}
	}
	st.stats.close()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

func setEnv(env []string, name, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			panic(fmt.Sprintf("refsuite runner: %s=%q: want a positive duration", name, v))
		}
		return d
	}
	return def
}

// redact hides the values of the password variables in the log line.
func redact(env []string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(name, "_AUTH") {
			kv = name + "=<redacted>"
		}
		out[i] = kv
	}
	return out
}

func errOrOK(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.String()
	}
	return err.Error()
}
