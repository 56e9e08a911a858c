package refdiff

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// The reference: module, pinned version, and the package of its server.
const (
	referenceModule  = "github.com/envoyproxy/ratelimit"
	referenceVersion = "v1.4.1-0.20260122083618-3fb702589d36"
	referenceCmd     = referenceModule + "/src/service_cmd"
)

// integrationConfigDir is where the reference keeps the configs of its
// integration tests, inside its module.
const integrationConfigDir = "test/integration/runtime/current/ratelimit/config"

var (
	buildsOnce sync.Once
	refBin     string // the reference's service_cmd
	ourBin     string // ratelimitd
	refSrc     string // the reference module's directory in the module cache
	buildsErr  error
	buildsTmp  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildsTmp != "" {
		_ = os.RemoveAll(buildsTmp)
	}
	os.Exit(code)
}

// goCmd runs the go command in dir with the environment of this process
// minus GOFLAGS (make's -race, -mod=... must not reach go install), plus
// extra.
func goCmd(ctx context.Context, dir string, extra []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") && !strings.HasPrefix(kv, "GOWORK=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append([]string{"GOWORK=off", "GO111MODULE=on"}, extra...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// builds builds (or reuses) both binaries and finds the reference's
// source. The reference is built with `go install` from the module proxy
// into a per-user cache directory keyed by its version, reused by later
// runs; a failure fails the test (make test runs where the module proxy
// is reachable).
func builds(t *testing.T) (ref, ours, src string) {
	t.Helper()
	buildsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		tmp, err := os.MkdirTemp("", "ratelimitd-refdiff-")
		if err != nil {
			buildsErr = err
			return
		}
		buildsTmp = tmp

		cache, err := os.UserCacheDir()
		if err != nil {
			cache = tmp
		}
		gobin := filepath.Join(cache, "ratelimitd-refdiff", referenceVersion+"-"+runtime.GOOS+"-"+runtime.GOARCH)
		refBin = filepath.Join(gobin, "service_cmd")
		if _, err := os.Stat(refBin); err != nil {
			staging, err := os.MkdirTemp(filepath.Dir(gobin), "staging-")
			if err != nil {
				if err = os.MkdirAll(filepath.Dir(gobin), 0o755); err == nil {
					staging, err = os.MkdirTemp(filepath.Dir(gobin), "staging-")
				}
			}
			if err != nil {
				buildsErr = fmt.Errorf("reference build directory: %w", err)
				return
			}
			if out, err := goCmd(ctx, tmp, []string{"GOBIN=" + staging, "CGO_ENABLED=0"}, "install", referenceCmd+"@"+referenceVersion); err != nil {
				_ = os.RemoveAll(staging)
				buildsErr = fmt.Errorf("go install %s@%s (needs the Go module proxy): %v\n%s", referenceCmd, referenceVersion, err, out)
				return
			}
			_ = os.RemoveAll(gobin)
			if err := os.Rename(staging, gobin); err != nil && !exists(refBin) {
				buildsErr = fmt.Errorf("reference binary: %w", err)
				return
			}
			_ = os.RemoveAll(staging)
		}

		out, err := goCmd(ctx, tmp, nil, "mod", "download", "-json", referenceModule+"@"+referenceVersion)
		if err != nil {
			buildsErr = fmt.Errorf("go mod download %s@%s: %v\n%s", referenceModule, referenceVersion, err, out)
			return
		}
		var mod struct{ Dir, Error string }
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			buildsErr = fmt.Errorf("go mod download -json: no Dir (%v %s): %s", err, mod.Error, out)
			return
		}
		refSrc = mod.Dir

		root, err := filepath.Abs("../..")
		if err != nil {
			buildsErr = err
			return
		}
		ourBin = filepath.Join(tmp, "ratelimitd")
		if out, err := goCmd(ctx, root, []string{"CGO_ENABLED=0"}, "build", "-o", ourBin, "./cmd/ratelimitd"); err != nil {
			buildsErr = fmt.Errorf("go build ./cmd/ratelimitd: %v\n%s", err, out)
		}
	})
	if buildsErr != nil {
		t.Fatal(buildsErr)
	}
	return refBin, ourBin, refSrc
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// configRoot lays out a RUNTIME_ROOT with RUNTIME_SUBDIRECTORY=ratelimit:
// the reference's integration configs, copied from its module, and
// extra files (name → YAML; a name may hold '/' for a file in a
// subdirectory). It returns the RUNTIME_ROOT.
func configRoot(t *testing.T, src string, extra map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "current")
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(src, filepath.FromSlash(integrationConfigDir))
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatalf("the reference's integration configs: %v", err)
	}
	n := 0
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no YAML files in %s", from)
	}
	for name, y := range extra {
		f := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// proc is one running server (the reference or ratelimitd).
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	logs   bytes.Buffer
	done   chan struct{}
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
}

func (p *proc) Write(b []byte) (int, error) { p.mu.Lock(); defer p.mu.Unlock(); return p.logs.Write(b) }

func (p *proc) Logs() string { p.mu.Lock(); defer p.mu.Unlock(); return p.logs.String() }

// noConfigMessage is the reference's (and reference mode's) error for a
// call while no config is in force.
const noConfigMessage = "no rate limit configuration loaded"

// startProc runs argv with env (no other variable) and waits until it
// answers ShouldRateLimit (a request for a domain no config has, which
// counts nothing). With failedLoad set, it is also ready when it answers
// noConfigMessage after logging failedLoad (its first config load was
// refused). It is stopped at cleanup. listen gives the listener variables
// (GRPC_PORT first) on fresh ports each time it is called: a start whose
// process could not bind one is repeated (testproc.StartRetrying).
func startProc(t *testing.T, name string, argv, env []string, listen func() []string, failedLoad string) *proc {
	t.Helper()
	var p *proc
	err := testproc.StartRetrying(name, func() error {
		le := listen()
		var err error
		p, err = startProcOnce(t, name, argv, append(append([]string{}, env...), le...), strings.TrimPrefix(le[0], "GRPC_PORT="), failedLoad)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startProcOnce is one start of startProc. It returns an error wrapping
// testproc.ErrPortInUse when the process exited because a port it was
// given was taken.
func startProcOnce(t *testing.T, name string, argv, env []string, grpcPort, failedLoad string) (*proc, error) {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	testproc.KillWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s logs\n%s", name, p.Logs())
		}
	})
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.conn, p.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	probe := &rlsv3.RateLimitRequest{Domain: "refdiff-probe-no-such-domain", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "probe", Value: "x"}}},
	}}
	exited := func() error {
		if testproc.PortInUse(p.Logs()) {
			return fmt.Errorf("%s exited during startup: %w\n%s", name, testproc.ErrPortInUse, p.Logs())
		}
		return fmt.Errorf("%s exited during startup: %v\n%s", name, p.cmd.ProcessState, p.Logs())
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := p.client.ShouldRateLimit(ctx, probe)
		cancel()
		ready := err == nil ||
			failedLoad != "" && status.Convert(err).Message() == noConfigMessage && strings.Contains(p.Logs(), failedLoad)
		select {
		case <-p.done:
			// Exited: whatever answered was not this process.
			return nil, exited()
		default:
		}
		if ready {
			return p, nil
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer ShouldRateLimit within 60s (last error %v)\n%s", name, err, p.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pair is the reference and ratelimitd with the same environment on one
// redis-server; each has its own CACHE_KEY_PREFIX so their counters do
// not collide.
type pair struct {
	ref, ours *proc
	redis     *redistest.Server
	// resetHeader is the name of the reset header, whose value is
	// compared within the duration tolerance.
	resetHeader string
	// differences are the documented differences applied to every
	// answer of this pair before comparing.
	differences []difference
	// env is the environment both servers share (without listeners,
	// key prefix and statsd); ourBin is ratelimitd's binary.
	env    []string
	ourBin string
	// starts counts the starts of both servers (more than 2 when a
	// port was taken).
	starts int
}

// withEnv is base with env applied: NAME=value replaces or adds NAME, a
// bare NAME removes it.
func withEnv(base, env []string) []string {
	out := append([]string{}, base...)
	for _, kv := range env {
		name, _, set := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		if set {
			out = append(out, kv)
		}
	}
	return out
}

// difference is a documented difference between ratelimitd and the pinned
// reference: name says what differs and why; normalize rewrites copies of
// both answers so that everything else is still compared.
type difference struct {
	name      string
	normalize func(ref, ours *rlsv3.RateLimitResponse)
}

// startPair starts both servers with the reference-style environment env
// (RUNTIME_ROOT etc. are added) and the extra config files.
func startPair(t *testing.T, env []string, extra map[string]string) *pair {
	t.Helper()
	return startPairWith(t, pairConfig{env: env, extra: extra})
}

// pairConfig is what startPairWith starts a pair with.
type pairConfig struct {
	// env is added to the environment both servers share; an entry
	// without '=' removes that variable from it.
	env []string
	// extra are config files next to the reference's integration
	// configs (configRoot).
	extra map[string]string
	// refSink and ourSink, when both are set, receive each server's
	// statsd stats (USE_STATSD=true over UDP); else statsd is off.
	refSink, ourSink *testproc.StatsdSink
	// refusedConfig: the config is expected to be refused at startup;
	// each server is ready once it logged the refusal (refFailedLoad,
	// ourFailedLoad) and answers noConfigMessage.
	refusedConfig bool
	// takeHTTPPort: the port picked for each server's HTTP listener on
	// its first start is bound by the test first, as another process
	// could between the pick and the server's bind (TestStartPairRetries).
	takeHTTPPort bool
}

// takePort listens on 127.0.0.1:port until t ends.
func takePort(t *testing.T, port string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// The log lines of a refused first config load.
const (
	refFailedLoad = "Error loading new configuration"
	ourFailedLoad = "config rejected; no config loaded yet"
)

// startPairWith starts the reference and ratelimitd as pc says.
func startPairWith(t *testing.T, pc pairConfig) *pair {
	t.Helper()
	env, extra, refSink, ourSink := pc.env, pc.extra, pc.refSink, pc.ourSink
	refBin, ourBin, src := builds(t)
	redistest.Require(t)
	srv := redistest.Standalone(t)
	root := configRoot(t, src, extra)
	common := []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr(),
		// Generous: a timed-out ratelimitd call would fail open where
		// the reference waits.
		"REDIS_TIMEOUT=5s",
		"LOG_LEVEL=info",
	}
	if refSink == nil || ourSink == nil {
		common = append(common, "USE_STATSD=false")
	}
	common = withEnv(common, env)
	p := &pair{redis: srv, resetHeader: "RateLimit-Reset", env: common, ourBin: ourBin}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LIMIT_RESET_HEADER="); ok {
			p.resetHeader = v
		}
	}
	// Each server's listeners, on ports no other server of this process
	// is given (deploytest.FreePorts), fresh on each start.
	listen := func(taken *net.Listener) func() []string {
		return func() []string {
			ports := deploytest.FreePorts(t, 3)
			p.starts++
			if pc.takeHTTPPort && *taken == nil {
				*taken = takePort(t, ports[1])
			}
			return []string{"GRPC_PORT=" + ports[0], "GRPC_HOST=127.0.0.1", "HOST=127.0.0.1", "PORT=" + ports[1],
				"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[2]}
		}
	}
	re := []string{"CACHE_KEY_PREFIX=refdiff_reference_"}
	oe := []string{"CACHE_KEY_PREFIX=refdiff_ratelimitd_"}
	if refSink != nil && ourSink != nil {
		re = append(re, statsdEnv(t, refSink)...)
		oe = append(oe, statsdEnv(t, ourSink)...)
	}
	refFailed, ourFailed := "", ""
	if pc.refusedConfig {
		refFailed, ourFailed = refFailedLoad, ourFailedLoad
	}
	var refTaken, ourTaken net.Listener
	p.ref = startProc(t, "reference", []string{refBin}, append(append([]string{}, common...), re...), listen(&refTaken), refFailed)
	// `ratelimitd serve` with nothing but the environment: the mode
	// comes from the environment alone.
	p.ours = startProc(t, "ratelimitd", []string{ourBin, "serve"}, append(append([]string{}, common...), oe...), listen(&ourTaken), ourFailed)
	if !strings.Contains(p.ours.Logs(), "mode=reference") {
		t.Fatalf("ratelimitd is not in reference mode with the reference's environment:\n%s", p.ours.Logs())
	}
	return p
}

// statsdEnv is the environment that sends a server's statsd stats to sink.
func statsdEnv(t *testing.T, sink *testproc.StatsdSink) []string {
	t.Helper()
	host, port, err := net.SplitHostPort(sink.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return []string{"USE_STATSD=true", "STATSD_PROTOCOL=udp", "STATSD_HOST=" + host, "STATSD_PORT=" + port}
}

// step is one ShouldRateLimit call, sent to both servers.
type step struct {
	name string
	req  *rlsv3.RateLimitRequest
}

// scenario is a sequence of steps on fresh counters. limited: some answer
// of the reference has a current_limit (the configs are in force);
// reachesOver: some answer of the reference is OVER_LIMIT.
type scenario struct {
	name        string
	steps       []step
	limited     bool
	reachesOver bool
	// named are documented differences at given steps: instead of
	// comparing the two answers of step i, named[i] checks that they
	// differ exactly as documented ("" when they do).
	named map[int]namedStep
}

// namedStep is a documented difference of one step: why names it, check
// returns what is wrong with the pair of answers ("" when they differ
// exactly as documented).
type namedStep struct {
	why   string
	check func(ref, ours answer) string
}

// answer is one server's reply to a step.
type answer struct {
	resp *rlsv3.RateLimitResponse
	err  error
}

func ask(p *proc, r *rlsv3.RateLimitRequest) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := p.client.ShouldRateLimit(ctx, r)
	return answer{resp, err}
}

// windowMargin is the time a scenario may take: it starts only with at
// least this much left before the next minute boundary (every window of
// the configs is a whole number of minutes, except second limits, which
// the scenarios hit once per fresh value).
const windowMargin = 15 * time.Second

// waitWindow waits until at least windowMargin is left before the next
// minute boundary and returns the boundary the scenario must end before.
func waitWindow() time.Time {
	now := time.Now()
	next := now.Truncate(time.Minute).Add(time.Minute)
	if next.Sub(now) < windowMargin {
		time.Sleep(next.Sub(now) + 100*time.Millisecond)
		next = next.Add(time.Minute)
	}
	return next
}

// run sends every step of sc to both servers after flushing Redis and
// compares the answers. A scenario that does not end within the minute it
// started in (more than windowMargin) fails: its counters
// may have been compared across two windows.
func (p *pair) run(t *testing.T, sc scenario) {
	t.Helper()
	if err := p.redis.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	end := waitWindow()
	var limited, over bool
	for i, s := range sc.steps {
		t0 := time.Now()
		ra := ask(p.ref, s.req)
		oa := ask(p.ours, s.req)
		if ra.resp != nil && oa.resp != nil && len(p.differences) > 0 {
			ra.resp = proto.Clone(ra.resp).(*rlsv3.RateLimitResponse)
			oa.resp = proto.Clone(oa.resp).(*rlsv3.RateLimitResponse)
			for _, d := range p.differences {
				d.normalize(ra.resp, oa.resp)
			}
		}
		// Durations are whole seconds computed at each server's own
		// instant: a second of rounding plus the time between the calls.
		tol := time.Second + time.Since(t0).Round(time.Second) + time.Second/2
		if n, ok := sc.named[i]; ok {
			if msg := n.check(ra, oa); msg != "" {
				t.Errorf("%s, step %d (%s), documented difference %q: %s\nreference: %v %v\nratelimitd: %v %v",
					sc.name, i, s.name, n.why, msg, ra.resp, ra.err, oa.resp, oa.err)
			}
			over = over || ra.resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		for _, d := range compare(ra, oa, tol, p.resetHeader) {
			t.Errorf("%s, step %d (%s): %s\nrequest: %v\nreference: %v %v\nratelimitd: %v %v",
				sc.name, i, s.name, d, s.req, ra.resp, ra.err, oa.resp, oa.err)
		}
		if ra.resp != nil {
			over = over || ra.resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			for _, st := range ra.resp.GetStatuses() {
				limited = limited || st.GetCurrentLimit() != nil
			}
		}
	}
	if now := time.Now(); !now.Before(end) {
		t.Errorf("%s: the scenario took longer than the %v it was given (it ended %v after the minute boundary %v): its counts may span two windows", sc.name, windowMargin, now.Sub(end).Round(time.Millisecond), end.Format(time.TimeOnly))
	}
	if sc.limited && !limited {
		t.Errorf("%s: the reference applied no limit in any step: are the configs loaded?", sc.name)
	}
	if sc.reachesOver && !over {
		t.Errorf("%s: the reference never answered OVER_LIMIT", sc.name)
	}
}

// compare returns every difference between the reference's answer ra and
// ratelimitd's oa. Durations (duration_until_reset, the reset header) may
// differ by tol.
func compare(ra, oa answer, tol time.Duration, resetHeader string) []string {
	var out []string
	if (ra.err == nil) != (oa.err == nil) {
		return []string{fmt.Sprintf("error %v, reference error %v", oa.err, ra.err)}
	}
	if ra.err != nil {
		re, oe := status.Convert(ra.err), status.Convert(oa.err)
		if re.Code() != oe.Code() || re.Message() != oe.Message() {
			out = append(out, fmt.Sprintf("error %s %q, reference %s %q", oe.Code(), oe.Message(), re.Code(), re.Message()))
		}
		return out
	}
	r, o := ra.resp, oa.resp
	if r.GetOverallCode() != o.GetOverallCode() {
		out = append(out, fmt.Sprintf("overall_code %v, reference %v", o.GetOverallCode(), r.GetOverallCode()))
	}
	if len(r.GetStatuses()) != len(o.GetStatuses()) {
		return append(out, fmt.Sprintf("%d statuses, reference %d", len(o.GetStatuses()), len(r.GetStatuses())))
	}
	for i := range r.GetStatuses() {
		rst, ost := r.GetStatuses()[i], o.GetStatuses()[i]
		if rst.GetCode() != ost.GetCode() {
			out = append(out, fmt.Sprintf("status %d: code %v, reference %v", i, ost.GetCode(), rst.GetCode()))
		}
		if !proto.Equal(rst.GetCurrentLimit(), ost.GetCurrentLimit()) {
			out = append(out, fmt.Sprintf("status %d: current_limit %v, reference %v", i, ost.GetCurrentLimit(), rst.GetCurrentLimit()))
		}
		if rst.GetLimitRemaining() != ost.GetLimitRemaining() {
			out = append(out, fmt.Sprintf("status %d: limit_remaining %d, reference %d", i, ost.GetLimitRemaining(), rst.GetLimitRemaining()))
		}
		rd, od := rst.GetDurationUntilReset(), ost.GetDurationUntilReset()
		switch {
		case (rd == nil) != (od == nil):
			out = append(out, fmt.Sprintf("status %d: duration_until_reset %v, reference %v", i, od, rd))
		case rd != nil && absDuration(rd.AsDuration()-od.AsDuration()) > tol:
			out = append(out, fmt.Sprintf("status %d: duration_until_reset %v, reference %v (tolerance %v)", i, od.AsDuration(), rd.AsDuration(), tol))
		}
		if !proto.Equal(rst.GetQuota(), ost.GetQuota()) {
			out = append(out, fmt.Sprintf("status %d: quota %v, reference %v", i, ost.GetQuota(), rst.GetQuota()))
		}
	}
	rh, oh := r.GetResponseHeadersToAdd(), o.GetResponseHeadersToAdd()
	if len(rh) != len(oh) {
		out = append(out, fmt.Sprintf("response_headers_to_add %v, reference %v", oh, rh))
	} else {
		for i := range rh {
			k, rv, ov := rh[i].GetKey(), rh[i].GetValue(), oh[i].GetValue()
			if k != oh[i].GetKey() {
				out = append(out, fmt.Sprintf("header %d: %s, reference %s", i, oh[i].GetKey(), k))
				continue
			}
			if k == resetHeader {
				rn, err1 := strconv.ParseInt(rv, 10, 64)
				on, err2 := strconv.ParseInt(ov, 10, 64)
				if err1 != nil || err2 != nil || absDuration(time.Duration(rn-on)*time.Second) > tol {
					out = append(out, fmt.Sprintf("header %s: %q, reference %q (tolerance %v)", k, ov, rv, tol))
				}
				continue
			}
			if rv != ov {
				out = append(out, fmt.Sprintf("header %s: %q, reference %q", k, ov, rv))
			}
		}
	}
	if d := cmp.Diff(r.GetRequestHeadersToAdd(), o.GetRequestHeadersToAdd(), protocmp.Transform()); d != "" {
		out = append(out, "request_headers_to_add (-reference +ratelimitd):\n"+d)
	}
	if !bytes.Equal(r.GetRawBody(), o.GetRawBody()) {
		out = append(out, fmt.Sprintf("raw_body %q, reference %q", o.GetRawBody(), r.GetRawBody()))
	}
	if d := cmp.Diff(r.GetDynamicMetadata(), o.GetDynamicMetadata(), protocmp.Transform()); d != "" {
		out = append(out, "dynamic_metadata (-reference +ratelimitd):\n"+d)
	}
	if !proto.Equal(r.GetQuota(), o.GetQuota()) {
		out = append(out, fmt.Sprintf("quota %v, reference %v", o.GetQuota(), r.GetQuota()))
	}
	return out
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Request builders.

// d is a descriptor of key, value pairs; hits sets the descriptor's own
// hits_addend.
var (
	d    = testproc.Desc
	hits = testproc.WithHits
)

// override sets the descriptor's limit override.
func override(x *rlcommon.RateLimitDescriptor, rpu uint32, unit string) *rlcommon.RateLimitDescriptor {
	x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unitOf(unit)}
	return x
}

func req(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// reqHits is req with the request-level hits_addend.
func reqHits(n uint32, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	r := req(domain, ds...)
	r.HitsAddend = n
	return r
}

// repeat is n steps of the same request (built afresh for each step).
func repeat(n int, name string, mk func() *rlsv3.RateLimitRequest) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = step{fmt.Sprintf("%s #%d", name, i+1), mk()}
	}
	return out
}

func one(name string, r *rlsv3.RateLimitRequest) []step { return []step{{name, r}} }

func steps(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// unique returns a value no earlier scenario of this process used, for
// counters that must start fresh regardless of Redis.
func unique(prefix string) string {
	uniqueMu.Lock()
	defer uniqueMu.Unlock()
	uniqueN++
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(uniqueN)
}

var (
	uniqueMu sync.Mutex
	uniqueN  int
)
