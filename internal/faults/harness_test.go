package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// bin is the ratelimitd binary built once by TestMain.
var bin string

// spinEnv, set in the environment of a re-executed test binary, makes it a
// CPU spinner (see pinCPUs) instead of running tests.
const spinEnv = "RATELIMITD_FAULTS_SPIN"

// spinMaxLife bounds a spinner's life should its parent never close its
// stdin.
const spinMaxLife = 15 * time.Minute

func TestMain(m *testing.M) {
	if n := os.Getenv(spinEnv); n != "" {
		spinChild(n)
		return
	}
	// The outages here are deliberate: go-redis would log every failed
	// dial of the helpers' clients.
	goredis.SetLogger(quiet{})
	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	os.Exit(deploytest.BuildMain(m, "faults", &bin, flags...))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// ---------------------------------------------------------------------------
// CPU pinning

// spinChild runs n goroutines that spin until stdin is closed (the parent
// ended the pin or died) or spinMaxLife passes.
func spinChild(arg string) {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a positive count\n", spinEnv, arg)
		os.Exit(2)
	}
	var sink atomic.Uint64
	for range n {
		go func() {
			var x uint64
			for {
				x++
				if x&(1<<30) != 0 {
					sink.Store(x)
					x = 0
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(spinMaxLife):
	}
	os.Exit(0)
}

// pinCPUs starts a child process (this test binary re-executed) whose n
// goroutines spin in busy loops until t ends, so that ratelimitd, Redis and
// the test compete for the CPUs with them.
func pinCPUs(t testing.TB, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), spinEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	testproc.KillWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
		cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		t.Logf("CPU pin: %d spinning goroutines used %.1f CPU-s in %.1f s", n, cpu.Seconds(), time.Since(started).Seconds())
	})
}

// ---------------------------------------------------------------------------
// Config

// domain is the config domain of every request.
const domain = "faults"

// Limits of the rules of configYAML (per day, fixed window, failure_mode
// left at its default: open, as a fresh user's rule).
const bigLimit = 1_000_000_000

// configYAML has one rule per limit: key "l<N>" allows N per day; key big
// allows bigLimit per day. A day, so that no window turns over within a
// test (see awayFromWindowEnd).
var configYAML = func() string {
	var b strings.Builder
	b.WriteString("domain: " + domain + "\ndescriptors:\n")
	for _, n := range []int{1, 10, 30, bigLimit} {
		key := "l" + strconv.Itoa(n)
		if n == bigLimit {
			key = "big"
		}
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit: {unit: day, requests_per_unit: %d}\n", key, n)
	}
	return b.String()
}()

// window is the rules' window (fixed, aligned to the Unix epoch).
const window = 24 * time.Hour

// writeConfig writes configYAML into a new directory and returns it.
func writeConfig(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "faults.yaml"), []byte(configYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// awayFromWindowEnd waits past the end of the current window when less
// than margin of it is left, so that a test's counts stay in one window.
func awayFromWindowEnd(t testing.TB, margin time.Duration) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(window).Add(window).Sub(now); left < margin {
		t.Logf("%v left in the current window: waiting for the next", left)
		time.Sleep(left + 100*time.Millisecond)
	}
}

var fresh atomic.Uint64

// runID makes descriptor values unique across runs sharing a Redis.
var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

// freshValue is a descriptor value no earlier call used.
func freshValue() string { return runID + "-" + strconv.FormatUint(fresh.Add(1), 10) }

// ---------------------------------------------------------------------------
// Redis deployments

// backend is a Redis deployment and the `ratelimitd serve` flags that
// select it.
type backend struct {
	name string
	args []string
}

// standaloneBackend points at srv (with its CA for rediss://).
func standaloneBackend(name string, srv *redistest.Server) backend {
	args := []string{"--backend=redis", "--redis-url=" + srv.URL()}
	if f := srv.TLS(); f != nil {
		args = append(args, "--redis-tls-ca="+f.CAFile)
	}
	return backend{name: name, args: args}
}

// sentinelBackend points at g's sentinels.
func sentinelBackend(g *redistest.SentinelGroup) backend {
	return backend{name: "sentinel", args: []string{
		"--backend=redis", "--redis-mode=sentinel",
		"--redis-addrs=" + strings.Join(g.SentinelAddrs(), ","),
		"--redis-master=" + redistest.MasterName,
	}}
}

// clusterBackend points at g's nodes as seeds.
func clusterBackend(g *redistest.ClusterGroup) backend {
	return backend{name: "cluster", args: []string{
		"--backend=redis", "--redis-mode=cluster",
		"--redis-addrs=" + strings.Join(g.Addrs(), ","),
	}}
}

// ---------------------------------------------------------------------------
// ratelimitd processes

// proc is one running `ratelimitd serve`.
type proc struct {
	*deploytest.Serve
	grpc string // host:port
	http string
}

// startProc runs `ratelimitd serve --config cfgDir args...` with loopback
// listeners on free ports (no debug listener) and returns once it has
// logged its listeners (within 30 s). It does not use t, so that several
// can start at once; the caller stops it.
func startProc(cfgDir string, args []string) (*proc, error) {
	full := append([]string{"serve", "--config", cfgDir, "--log-format=json",
		"--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr="}, args...)
	// GORACE: a -race binary otherwise sleeps 1 s at exit
	// (atexit_sleep_ms), which would dominate the fresh bursts.
	s, err := deploytest.StartServe(bin, full, deploytest.CleanEnv("GORACE=atexit_sleep_ms=0"), []string{deploytest.GRPC, deploytest.HTTP}, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return &proc{Serve: s, grpc: s.Addrs[deploytest.GRPC], http: s.Addrs[deploytest.HTTP]}, nil
}

// stop sends SIGTERM and waits up to 20 s (deploytest.Serve.Stop). Safe to
// call more than once.
func (p *proc) stop() error { return p.Stop(20 * time.Second) }

// fleet is n ratelimitd instances of one config and backend, with one gRPC
// client connection each.
type fleet struct {
	t     testing.TB
	procs []*proc
	conns []*grpc.ClientConn
	rls   []rlsv3.RateLimitServiceClient

	stopOnce sync.Once
}

// startFleet starts n instances at once, dials each and waits until each
// reports gRPC health SERVING for "" (a config is loaded: the first moment
// an orchestrator sends traffic). They are stopped when t ends, or by stop.
func startFleet(t testing.TB, n int, cfgDir string, b backend, extra ...string) *fleet {
	t.Helper()
	f := &fleet{t: t, procs: make([]*proc, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f.procs[i], errs[i] = startProc(cfgDir, append(clone(b.args), extra...)) })
	}
	wg.Wait()
	t.Cleanup(f.stop)
	if err := errors.Join(errs...); err != nil {
		for _, p := range f.procs {
			if p != nil {
				_ = p.stop()
			}
		}
		f.procs = nil
		t.Fatal(err)
	}
	for _, p := range f.procs {
		cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		f.conns = append(f.conns, cc)
		f.rls = append(f.rls, rlsv3.NewRateLimitServiceClient(cc))
	}
	for i := range f.procs {
		f.waitHealth(i, "", healthpb.HealthCheckResponse_SERVING, 20*time.Second)
	}
	return f
}

// clone copies s (so that appending to it never aliases the backend's).
func clone(s []string) []string { return append([]string(nil), s...) }

// stop closes the connections and stops every instance at once, failing
// t for an unclean exit. Safe to call more than once.
func (f *fleet) stop() {
	f.stopOnce.Do(func() {
		for _, cc := range f.conns {
			_ = cc.Close()
		}
		errs := make([]error, len(f.procs))
		var wg sync.WaitGroup
		for i, p := range f.procs {
			wg.Go(func() { errs[i] = p.stop() })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			f.t.Error(err)
		}
	})
}

// logs is the last lines of every instance's log, for a failure message.
func (f *fleet) logs(n int) string {
	var b strings.Builder
	for i, p := range f.procs {
		fmt.Fprintf(&b, "--- ratelimitd %d (%s)\n%s\n", i, p.grpc, p.LogTail(n))
	}
	return b.String()
}

// health is instance i's grpc.health.v1 status of service ("" and an error
// when the check itself failed). The check waits up to stateWithin for
// the answer: a starved instance may take seconds to answer, and a check
// that gave up sooner would say nothing about the instance.
func (f *fleet) health(i int, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stateWithin)
	defer cancel()
	resp, err := healthpb.NewHealthClient(f.conns[i]).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// waitHealth polls instance i's health of service every 10 ms until it is
// want, failing t after within.
func (f *fleet) waitHealth(i int, service string, want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) {
	f.t.Helper()
	if err := testproc.WaitHealth(f.conns[i], service, want, within); err != nil {
		f.t.Fatalf("instance %d: %v\n%s", i, err, f.logs(30))
	}
}

// backendHealth is the gRPC health service name of the store.
const backendHealth = "ratelimitd.backend"

// ---------------------------------------------------------------------------
// Calls

// noDeadlineWatchdog cancels a call made without a deadline when it has not
// returned after this long (a cancellation is not sent to the server as a
// deadline: the server sees a call without one). It only keeps a hung
// call from hanging the test.
const noDeadlineWatchdog = time.Minute

// call sends ShouldRateLimit for key=value to rls. hits nil: the default
// cost 1; else the descriptor's hits_addend (0: check only). deadline 0:
// no gRPC deadline; else the call's deadline, as Envoy's filter timeout.
func call(rls rlsv3.RateLimitServiceClient, key, value string, hits *uint64, deadline time.Duration) (*rlsv3.RateLimitResponse, error) {
	var ctx context.Context
	var cancel context.CancelFunc
	if deadline > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), deadline)
	} else {
		ctx, cancel = context.WithCancel(context.Background())
		stop := time.AfterFunc(noDeadlineWatchdog, cancel)
		defer stop.Stop()
	}
	defer cancel()
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}})
}

// outcome classifies one answer.
type outcome int

const (
	okDecided    outcome = iota // OK, decided by the store (RateLimit header present)
	okFailedOpen                // OK without a RateLimit header: the store failed, failure_mode open
	overLimit                   // OVER_LIMIT
	callError                   // a gRPC error
)

// classify sorts an answer of call. A decided answer on a rule carries the
// IETF RateLimit header (the default --headers=ietf); a failed-open one
// does not (its state is unknown).
func classify(resp *rlsv3.RateLimitResponse, err error) outcome {
	switch {
	case err != nil:
		return callError
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		return overLimit
	case hasHeader(resp, "RateLimit"):
		return okDecided
	default:
		return okFailedOpen
	}
}

func hasHeader(r *rlsv3.RateLimitResponse, name string) bool {
	for _, h := range r.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return true
		}
	}
	return false
}

// tally counts outcomes; errs counts gRPC errors by code.
type tally struct {
	decided, failedOpen, over int
	errs                      map[codes.Code]int
}

func (t *tally) add(resp *rlsv3.RateLimitResponse, err error) {
	switch classify(resp, err) {
	case okDecided:
		t.decided++
	case okFailedOpen:
		t.failedOpen++
	case overLimit:
		t.over++
	case callError:
		if t.errs == nil {
			t.errs = map[codes.Code]int{}
		}
		t.errs[status.Code(err)]++
	}
}

func (t *tally) merge(o tally) {
	t.decided += o.decided
	t.failedOpen += o.failedOpen
	t.over += o.over
	for c, n := range o.errs {
		if t.errs == nil {
			t.errs = map[codes.Code]int{}
		}
		t.errs[c] += n
	}
}

// ok is the OK answers (admitted calls).
func (t tally) ok() int { return t.decided + t.failedOpen }

// errors is the number of calls that returned a gRPC error.
func (t tally) errors() int {
	n := 0
	for _, v := range t.errs {
		n += v
	}
	return n
}

func (t tally) String() string {
	s := fmt.Sprintf("OK %d (%d failed open), OVER_LIMIT %d", t.ok(), t.failedOpen, t.over)
	if len(t.errs) > 0 {
		var parts []string
		for c, n := range t.errs {
			parts = append(parts, fmt.Sprintf("%v:%d", c, n))
		}
		sort.Strings(parts)
		s += ", errors " + strings.Join(parts, " ")
	}
	return s
}

// burst sends c ShouldRateLimit calls on key=value at once (each in its
// own goroutine, released together), call i to instance i mod n, each with
// deadline (0: none), and tallies the answers.
func (f *fleet) burst(key, value string, c int, deadline time.Duration) tally {
	start := make(chan struct{})
	results := make([]tally, c)
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() {
			<-start
			resp, err := call(f.rls[i%len(f.rls)], key, value, nil, deadline)
			results[i].add(resp, err)
		})
	}
	close(start)
	wg.Wait()
	var sum tally
	for _, r := range results {
		sum.merge(r)
	}
	return sum
}

// checkOnly is hits_addend 0: a decision that consumes nothing.
var checkOnly = new(uint64)

// remaining reads what is left of limit on key=value with a check-only call
// to instance i that the store decides: one answered failed open (the store
// failed) is retried every 20 ms, up to 10 s.
func (f *fleet) remaining(i int, key, value string) int64 {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := call(f.rls[i], key, value, checkOnly, 0)
		switch classify(resp, err) {
		case overLimit:
			return 0
		case okDecided:
			return int64(resp.GetStatuses()[0].GetLimitRemaining())
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no check-only call on %s=%s decided by the store within 10s (last: %v, %v)\n%s", key, value, resp, err, f.logs(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// warm makes calls on instance i until one is decided by the store (pool
// dialed, script loaded), failing t after 20 s.
func (f *fleet) warm(i int) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := call(f.rls[i], "big", "warm-"+freshValue(), nil, 0)
		if classify(resp, err) == okDecided {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("instance %d: no call decided by the store within 20s (last: %v, %v)\n%s", i, resp, err, f.logs(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// backendErrors sums ratelimitd_backend_errors_total by cause, and
// ratelimitd_backend_circuit_transitions_total by state entered (as
// "circuit_<state>"), over the fleet's instances, from their /metrics
// (zero counts omitted); for failure messages and logs.
func (f *fleet) backendErrors() map[string]float64 {
	out := map[string]float64{}
	// No keep-alive: no idle connection (and its goroutines) outlives the
	// scrape, for goleak.
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	series := []struct{ prefix, name string }{
		{`ratelimitd_backend_errors_total{cause="`, ""},
		{`ratelimitd_backend_circuit_transitions_total{to="`, "circuit_"},
	}
	for _, p := range f.procs {
		resp, err := c.Get("http://" + p.http + "/metrics")
		if err != nil {
			out["scrape_error"]++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		for line := range strings.SplitSeq(string(body), "\n") {
			for _, s := range series {
				rest, ok := strings.CutPrefix(line, s.prefix)
				if !ok {
					continue
				}
				label, val, ok := strings.Cut(rest, `"} `)
				if !ok {
					continue
				}
				if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil && v > 0 {
					out[s.name+label] += v
				}
			}
		}
	}
	return out
}

// addCounts adds b's counts into a.
func addCounts(a, b map[string]float64) {
	for k, v := range b {
		a[k] += v
	}
}

// intsString renders a list of counts as "a,b,c".
func intsString(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// waitHealthy waits until every instance reports its store healthy (gRPC
// health of backendHealth SERVING: circuit closed, last call or probe
// answered), failing t after stateWithin.
func (f *fleet) waitHealthy() {
	f.t.Helper()
	for i := range f.procs {
		f.waitHealth(i, backendHealth, healthpb.HealthCheckResponse_SERVING, stateWithin)
	}
}
