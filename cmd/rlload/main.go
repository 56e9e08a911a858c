// Command rlload drives a running ratelimitd (or any Envoy RLS v3 server) the
// way Envoy does: many concurrent ShouldRateLimit calls over shared HTTP/2
// connections. It reports decisions per second, latency percentiles and,
// when --metrics points at the service's /metrics, the service's CPU time per
// decision (from process_cpu_seconds_total).
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type config struct {
	addr        string
	domain      string
	key         string
	keys        int
	concurrency int
	conns       int
	duration    time.Duration
	warmup      time.Duration
	metrics     string
	timeout     time.Duration
	jsonOut     bool
}

// Result is the outcome of one run. Latencies are client-observed, in
// microseconds; CPUPerDecisionUS is -1 when --metrics was not given.
type Result struct {
	Decisions        int64   `json:"decisions"`
	OK               int64   `json:"ok"`
	OverLimit        int64   `json:"over_limit"`
	Errors           int64   `json:"errors"`
	Seconds          float64 `json:"seconds"`
	PerSecond        float64 `json:"decisions_per_second"`
	P50US            float64 `json:"p50_us"`
	P99US            float64 `json:"p99_us"`
	P999US           float64 `json:"p999_us"`
	CPUPerDecisionUS float64 `json:"service_cpu_us_per_decision"`
}

func main() {
	var c config
	fs := flag.NewFlagSet("rlload", flag.ExitOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "gRPC address of the rate-limit service")
	fs.StringVar(&c.domain, "domain", "bench", "RateLimitRequest.domain")
	fs.StringVar(&c.key, "key", "user", "descriptor entry key; values are key-0..key-(N-1)")
	fs.IntVar(&c.keys, "keys", 10000, "number of distinct descriptor values")
	fs.IntVar(&c.concurrency, "concurrency", 50, "concurrent callers")
	fs.IntVar(&c.conns, "conns", 2, "HTTP/2 connections shared by the callers (Envoy uses few)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured duration")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured warm-up")
	fs.StringVar(&c.metrics, "metrics", "", "service /metrics URL for CPU per decision (optional)")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "per-call timeout")
	fs.BoolVar(&c.jsonOut, "json", false, "print the result as JSON")
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
}

func run(ctx context.Context, c config) (Result, error) {
	if c.concurrency < 1 || c.keys < 1 || c.conns < 1 {
		return Result{}, errors.New("concurrency, keys and conns must be >= 1")
	}
	clients := make([]rlsv3.RateLimitServiceClient, c.conns)
	for i := range clients {
		cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Result{}, err
		}
		defer cc.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	reqs := make([]*rlsv3.RateLimitRequest, c.keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: c.key + "-" + strconv.Itoa(i)}},
		}}}
	}

	var measuring atomic.Bool
	var ok, over, errs atomic.Int64
	lat := make([][]time.Duration, c.concurrency)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < c.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			cl := clients[w%len(clients)]
			samples := make([]time.Duration, 0, 1<<16)
			for {
				select {
				case <-stop:
					lat[w] = samples
					return
				default:
				}
				req := reqs[rng.IntN(len(reqs))]
				cctx, cancel := context.WithTimeout(ctx, c.timeout)
				t0 := time.Now()
				resp, err := cl.ShouldRateLimit(cctx, req)
				d := time.Since(t0)
				cancel()
				if !measuring.Load() {
					continue
				}
				samples = append(samples, d)
				switch {
				case err != nil:
					errs.Add(1)
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				default:
					ok.Add(1)
				}
			}
		}(w)
	}
	time.Sleep(c.warmup)
	cpu0, cpuErr := scrapeCPU(c.metrics)
	start := time.Now()
	measuring.Store(true)
	time.Sleep(c.duration)
	measuring.Store(false)
	elapsed := time.Since(start)
	cpu1, cpuErr1 := scrapeCPU(c.metrics)
	close(stop)
	wg.Wait()

	var all []time.Duration
	for _, s := range lat {
		all = append(all, s...)
	}
	slices.Sort(all)
	r := Result{OK: ok.Load(), OverLimit: over.Load(), Errors: errs.Load(), Seconds: elapsed.Seconds(), CPUPerDecisionUS: -1}
	r.Decisions = r.OK + r.OverLimit
	r.PerSecond = float64(r.Decisions) / r.Seconds
	r.P50US, r.P99US, r.P999US = pct(all, 0.50), pct(all, 0.99), pct(all, 0.999)
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
