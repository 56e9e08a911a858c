// Command rlload drives a running ratelimitd (or any Envoy RLS v3 server) the
// way Envoy does: many concurrent ShouldRateLimit calls over shared HTTP/2
// connections. It reports decisions per second, latency percentiles, its own
// CPU time per decision and, when --metrics points at the service's
// /metrics, the service's CPU time per decision (from
// process_cpu_seconds_total).
//
// --client h2 (the default) frames gRPC by hand over HTTP/2 prior knowledge
// (h2c) with golang.org/x/net/http2: a writer and a reader goroutine per
// connection, requests marshalled once per key, writes coalesced into one
// flush. It costs a few µs of CPU per call, like Envoy, so that on a shared
// machine the cores go to the service and its backend. --client grpc uses
// grpc-go (about as much CPU per call as the service itself), for comparison.
//
//	rlload --addr 127.0.0.1:8081 --concurrency 50 --keys 10000 --duration 10s \
//	       --metrics http://127.0.0.1:8080/metrics
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

type config struct {
	addr        string
	client      string
	domain      string
	key         string
	keys        int
	concurrency int
	conns       int
	requests    int64
	duration    time.Duration
	warmup      time.Duration
	metrics     string
	timeout     time.Duration
	jsonOut     bool
	cpuProfile  string
}

// Result is the outcome of one run. Latencies are client-observed, in
// microseconds, from the moment a caller issues a call to the moment its
// answer is decoded. Decisions counts OK plus OVER_LIMIT answers; Errors
// counts calls that failed (transport error, timeout, non-zero grpc-status,
// malformed answer). CPUPerDecisionUS (the service's CPU, from --metrics) is
// -1 when --metrics was not given; ClientCPUPerDecisionUS is rlload's own
// user+system CPU (getrusage RUSAGE_SELF) over the measured interval, per
// decision (-1 when there were no decisions).
type Result struct {
	// Client is the load client used, --client: "h2" or "grpc".
	Client string `json:"client"`
	// Decisions is OK + OverLimit: the calls answered with a decision.
	Decisions int64 `json:"decisions"`
	// OK counts answers with overall_code OK.
	OK int64 `json:"ok"`
	// OverLimit counts answers with overall_code OVER_LIMIT.
	OverLimit int64 `json:"over_limit"`
	// Errors counts calls that failed (see above); they are not decisions.
	Errors int64 `json:"errors"`
	// Seconds is the measured interval's length (after --warmup), in
	// seconds.
	Seconds float64 `json:"seconds"`
	// PerSecond is Decisions / Seconds.
	PerSecond float64 `json:"decisions_per_second"`
	// P50US is the median client-observed latency, in µs (0 with no
	// measured call).
	P50US float64 `json:"p50_us"`
	// P99US is the 99th percentile latency, in µs.
	P99US float64 `json:"p99_us"`
	// P999US is the 99.9th percentile latency, in µs.
	P999US float64 `json:"p999_us"`
	// CPUPerDecisionUS is the service's CPU (process_cpu_seconds_total
	// scraped from --metrics before and after) per decision, in µs; -1
	// without --metrics.
	CPUPerDecisionUS float64 `json:"service_cpu_us_per_decision"`
	// ClientCPUPerDecisionUS is rlload's own user+system CPU per
	// decision, in µs; -1 when there were no decisions.
	ClientCPUPerDecisionUS float64 `json:"client_cpu_us_per_decision"`
}

func main() {
	var c config
	fs := flag.NewFlagSet("rlload", flag.ExitOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "gRPC address of the rate-limit service")
	fs.StringVar(&c.client, "client", "h2", "load client: h2 (gRPC framed by hand over HTTP/2 prior knowledge, a few µs of CPU per call) or grpc (grpc-go)")
	fs.StringVar(&c.domain, "domain", "bench", "RateLimitRequest.domain")
	fs.StringVar(&c.key, "key", "user", "descriptor entry key; values are key-0..key-(N-1)")
	fs.IntVar(&c.keys, "keys", 10000, "number of distinct descriptor values")
	fs.IntVar(&c.concurrency, "concurrency", 50, "concurrent calls in flight in total")
	fs.IntVar(&c.conns, "conns", 2, "HTTP/2 connections shared by the callers (Envoy uses few)")
	fs.Int64Var(&c.requests, "requests", 0, "make exactly this many calls (keys in turn: key-0, key-1, ...), all measured, then stop; 0 means run for --duration after --warmup with random keys")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured duration")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured warm-up")
	fs.StringVar(&c.metrics, "metrics", "", "service /metrics URL for CPU per decision (optional)")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "per-call timeout (sent as grpc-timeout)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the result as JSON")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write rlload's own CPU profile (pprof) of the measured interval to this file")
	_ = fs.Parse(os.Args[1:])
	r, err := run(context.Background(), c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlload:", err)
		os.Exit(1)
	}
	if c.jsonOut {
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	fmt.Printf("decisions %d (ok %d, over_limit %d, errors %d) in %.2fs\n", r.Decisions, r.OK, r.OverLimit, r.Errors, r.Seconds)
	fmt.Printf("throughput %.0f decisions/s\n", r.PerSecond)
	fmt.Printf("latency p50 %.0f µs, p99 %.0f µs, p99.9 %.0f µs\n", r.P50US, r.P99US, r.P999US)
	if r.CPUPerDecisionUS >= 0 {
		fmt.Printf("service CPU %.1f µs per decision\n", r.CPUPerDecisionUS)
	}
	if r.ClientCPUPerDecisionUS >= 0 {
		fmt.Printf("client CPU %.1f µs per decision (--client %s)\n", r.ClientCPUPerDecisionUS, r.Client)
	}
}

// load is the state the callers of one run share: which calls count, and in
// --requests mode which key the next call uses and when the run is over.
type load struct {
	keys      int
	limit     int64 // --requests; 0: unbounded
	measuring atomic.Bool
	tickets   atomic.Int64
	done      atomic.Int64
	finished  chan struct{} // closed when done reaches limit
}

func newLoad(c config) *load {
	return &load{keys: c.keys, limit: c.requests, finished: make(chan struct{})}
}

// next returns the key index of the next call, or false when the run has
// made all its --requests calls. Without --requests it draws a uniform key.
func (l *load) next(rng *rand.Rand) (int, bool) {
	if l.limit <= 0 {
		return rng.IntN(l.keys), true
	}
	t := l.tickets.Add(1) - 1
	if t >= l.limit {
		return 0, false
	}
	return int(t % int64(l.keys)), true
}

// complete notes that a call issued by next ended (whatever its outcome).
func (l *load) complete() {
	if l.limit > 0 && l.done.Add(1) == l.limit {
		close(l.finished)
	}
}

// tally is one caller's (or connection's) outcome counts and latency samples.
type tally struct {
	ok, over, errs int64
	lat            []time.Duration
}

func (t *tally) add(o tally) {
	t.ok += o.ok
	t.over += o.over
	t.errs += o.errs
	t.lat = append(t.lat, o.lat...)
}

// driver is one client implementation: start launches the callers, stop
// ends them and returns their merged tally; allFailed is closed when no
// caller can make progress any more (every connection lost).
type driver interface {
	start(ctx context.Context) error
	stop() tally
	allFailed() <-chan struct{}
}

func run(ctx context.Context, c config) (Result, error) {
	if c.concurrency < 1 || c.keys < 1 || c.conns < 1 {
		return Result{}, errors.New("concurrency, keys and conns must be >= 1")
	}
	if c.timeout <= 0 {
		return Result{}, errors.New("timeout must be > 0")
	}
	reqs := make([]*rlsv3.RateLimitRequest, c.keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: c.key + "-" + strconv.Itoa(i)}},
		}}}
	}
	ld := newLoad(c)
	var d driver
	switch c.client {
	case "h2":
		h, err := newH2Driver(c, ld, reqs)
		if err != nil {
			return Result{}, err
		}
		d = h
	case "grpc":
		d = newGRPCDriver(c, ld, reqs)
	default:
		return Result{}, fmt.Errorf("unknown --client %q (want h2 or grpc)", c.client)
	}
	if c.requests > 0 {
		ld.measuring.Store(true)
	}
	if err := d.start(ctx); err != nil {
		d.stop()
		return Result{}, err
	}
	var cpu0, cpu1 float64
	var cpuErr, cpuErr1 error
	var ru0, ru1 time.Duration
	var start time.Time
	var elapsed time.Duration
	if c.requests > 0 {
		cpu0, cpuErr = scrapeCPU(c.metrics)
		ru0 = selfCPU()
		start = time.Now()
		select {
		case <-ld.finished:
		case <-d.allFailed():
		case <-ctx.Done():
		}
		elapsed = time.Since(start)
		ru1 = selfCPU()
		cpu1, cpuErr1 = scrapeCPU(c.metrics)
	} else {
		time.Sleep(c.warmup)
		stopProfile, err := startProfile(c.cpuProfile)
		if err != nil {
			d.stop()
			return Result{}, err
		}
		cpu0, cpuErr = scrapeCPU(c.metrics)
		ru0 = selfCPU()
		start = time.Now()
		ld.measuring.Store(true)
		time.Sleep(c.duration)
		ld.measuring.Store(false)
		stopProfile()
		elapsed = time.Since(start)
		ru1 = selfCPU()
		cpu1, cpuErr1 = scrapeCPU(c.metrics)
	}
	t := d.stop()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	slices.Sort(t.lat)
	r := Result{Client: c.client, OK: t.ok, OverLimit: t.over, Errors: t.errs, Seconds: elapsed.Seconds(),
		CPUPerDecisionUS: -1, ClientCPUPerDecisionUS: -1}
	r.Decisions = r.OK + r.OverLimit
	r.PerSecond = float64(r.Decisions) / r.Seconds
	r.P50US, r.P99US, r.P999US = pct(t.lat, 0.50), pct(t.lat, 0.99), pct(t.lat, 0.999)
	if r.Decisions > 0 {
		r.ClientCPUPerDecisionUS = float64(ru1-ru0) / float64(time.Microsecond) / float64(r.Decisions)
	}
	if c.metrics != "" {
		if cpuErr != nil || cpuErr1 != nil {
			return r, fmt.Errorf("scrape %s: %w", c.metrics, errors.Join(cpuErr, cpuErr1))
		}
		if r.Decisions > 0 {
			r.CPUPerDecisionUS = (cpu1 - cpu0) * 1e6 / float64(r.Decisions)
		}
	}
	return r, nil
}

// startProfile starts a CPU profile into path (nothing when path is
// empty) and returns the function that stops it.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("rlload: cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("rlload: cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// selfCPU is rlload's user plus system CPU time so far (getrusage
// RUSAGE_SELF; 0 when the call fails).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i]) / float64(time.Microsecond)
}

// scrapeCPU reads process_cpu_seconds_total from a Prometheus text page.
func scrapeCPU(url string) (float64, error) {
	if url == "" {
		return 0, nil
	}
	resp, err := http.Get(url) //nolint:gosec // operator-supplied URL
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return parseCPU(resp.Body)
}

func parseCPU(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("process_cpu_seconds_total not found")
}
