// Command floor is a grpc-go server of envoy.service.ratelimit.v3's
// RateLimitService that makes exactly one Redis round trip per request
// (in batch mode, shared with the other requests in flight) and nothing
// else: no policy, no metrics. scripts/bench-compare.sh measures it in the
// same run as ratelimitd and the reference, as the floor of latency (and
// Redis work) of any service that talks to Redis once per request, and in
// batch mode as the floor of service CPU at high concurrency.
//
//	floor --grpc-addr 127.0.0.1:8081 --http-addr 127.0.0.1:8080 \
//	  --redis-addr 127.0.0.1:6379 --mode lua
//
// Each descriptor of a request is counted in a fixed window: its key is
// "floor_<domain>_<key>_<value>_<window start in s>", its limit the
// --limits entry of its first entry's key (else --limit). Modes:
//
//	lua   one EVALSHA per descriptor of a minimal script: INCRBY, PEXPIRE,
//	      return the count (the fixed cost of any script-based design)
//	pipe  INCRBY and EXPIRE per descriptor, pipelined, as
//	      envoyproxy/ratelimit counts
//	batch lua's EVALSHA per descriptor, but the requests in flight share
//	      round trips: one goroutine writes the commands of every request
//	      waiting (up to maxBatch) in one write on one connection, reads
//	      their replies and wakes each request; the floor of service CPU
//	      of a service that batches its Redis calls at high concurrency,
//	      served with ratelimitd's gRPC transport options
//	loop  batch mode's round trips, but one EVALSHA per flush (per hits
//	      and period among its descriptors) of the minimal loop script:
//	      INCRBY each key, PEXPIRE it when that created it, return the
//	      counts; the floor of Redis' work per decision of any service
//	      that decides a batch of fixed-window hits in one script call
//
// In lua and pipe modes every command of a request goes out in one write
// on one connection and its replies are read back in one go: one round
// trip. Connections are
// raw RESP sockets in a free list, so no client library work (health
// checks, pools' bookkeeping) adds to the floor.
//
// GET /healthcheck on --http-addr answers OK once the gRPC listener is open.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// floorLua is the minimal fixed-window script: the count after the hits,
// the key's TTL set on every call.
const floorLua = "local v = redis.call('INCRBY', KEYS[1], ARGV[1]) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return v"

// floorLoop is the minimal script deciding many fixed-window hits in one
// call: the counts after ARGV[1] hits on each key, the TTL ARGV[2] set
// only on a key the call created (as scripts/callgrind-redis.sh's
// floor-bB, plus the counts a service needs to decide).
const floorLoop = "local r = {} for i = 1, #KEYS do local v = redis.call('INCRBY', KEYS[i], ARGV[1]) " +
	"if v == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end r[i] = v end return r"

// limit is a fixed window: rate hits per period.
type limit struct {
	rate   int64
	period time.Duration
}

// server answers ShouldRateLimit with one Redis round trip.
type server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	addr   string
	lua    bool
	sha    string
	loop   string // loop mode: floorLoop's SHA1
	limits map[string]limit
	def    limit
	free   chan *conn
	batch  chan *job // batch mode: requests waiting for the flush loop
}

// conn is one RESP connection.
type conn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func (s *server) get() (*conn, error) {
	select {
	case c := <-s.free:
		return c, nil
	default:
	}
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		return nil, err
	}
	return &conn{c: nc, r: bufio.NewReaderSize(nc, 4096), w: bufio.NewWriterSize(nc, 4096)}, nil
}

func (s *server) put(c *conn) {
	select {
	case s.free <- c:
	default:
		_ = c.c.Close()
	}
}

// writeCmd writes one RESP command to w. A write error sticks to w and
// is returned by its Flush.
func writeCmd(w *bufio.Writer, args ...string) {
	_, _ = w.Write(appendCmd(make([]byte, 0, 64), args...))
}

// errReply is a Redis error reply.
type errReply string

func (e errReply) Error() string { return string(e) }

// readReply reads one reply: an integer, a simple or bulk string, or an
// error reply as errReply.
func readReply(r *bufio.Reader) (int64, string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return 0, "", errors.New("floor: empty reply")
	}
	switch line[0] {
	case ':':
		n, err := strconv.ParseInt(line[1:], 10, 64)
		return n, "", err
	case '+':
		return 0, line[1:], nil
	case '-':
		return 0, "", errReply(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return 0, "", err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return 0, "", err
		}
		return 0, string(b[:n]), nil
	}
	return 0, "", fmt.Errorf("floor: unexpected reply %q", line)
}

// ShouldRateLimit counts each descriptor's hits in one round trip and
// answers OVER_LIMIT when any count passed its limit.
func (s *server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	ds := req.GetDescriptors()
	lims := make([]limit, len(ds))
	if s.batch != nil {
		now := time.Now()
		keys := make([]string, len(ds))
		for i, d := range ds {
			keys[i], lims[i] = s.key(req.GetDomain(), d.GetEntries(), now)
		}
		return s.shouldRateLimitBatch(req, strconv.FormatInt(hits, 10), keys, lims)
	}
	c, err := s.get()
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(d)
	} else {
		_ = c.c.SetDeadline(time.Time{})
	}
	now := time.Now()
	h := strconv.FormatInt(hits, 10)
	for i, d := range ds {
		var key string
		key, lims[i] = s.key(req.GetDomain(), d.GetEntries(), now)
		l := lims[i]
		p := int64(l.period / time.Second)
		if s.lua {
			writeCmd(c.w, "EVALSHA", s.sha, "1", key, h, strconv.FormatInt(l.period.Milliseconds(), 10))
		} else {
			writeCmd(c.w, "INCRBY", key, h)
			writeCmd(c.w, "EXPIRE", key, strconv.FormatInt(p, 10))
		}
	}
	if err := c.w.Flush(); err != nil {
		_ = c.c.Close()
		return nil, err
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i := range ds {
		n, _, err := readReply(c.r)
		if err == nil && !s.lua {
			_, _, err = readReply(c.r)
		}
		if err != nil {
			_ = c.c.Close()
			return nil, err
		}
		if n > lims[i].rate {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	s.put(c)
	return resp, nil
}

// key returns the counter key of a descriptor's entries and its limit.
func (s *server) key(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, now time.Time) (string, limit) {
	var b strings.Builder
	b.WriteString("floor_")
	b.WriteString(domain)
	l := s.def
	for j, e := range entries {
		if j == 0 {
			if x, ok := s.limits[e.GetKey()]; ok {
				l = x
			}
		}
		b.WriteByte('_')
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		b.WriteString(e.GetValue())
	}
	p := int64(l.period / time.Second)
	ws := now.Unix() - now.Unix()%p
	b.WriteByte('_')
	b.WriteString(strconv.FormatInt(ws, 10))
	return b.String(), l
}

// parseLimits parses "key=rate/period ...", e.g. "user=1000/1s hot=10/1h".
func parseLimits(spec string) (map[string]limit, error) {
	m := map[string]limit{}
	for _, f := range strings.Fields(spec) {
		k, v, ok := strings.Cut(f, "=")
		r, p, ok2 := strings.Cut(v, "/")
		if !ok || !ok2 {
			return nil, fmt.Errorf("limit %q: want key=rate/period", f)
		}
		rate, err := strconv.ParseInt(r, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("limit %q: %w", f, err)
		}
		d, err := time.ParseDuration(p)
		if err != nil || d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("limit %q: period must be whole seconds", f)
		}
		m[k] = limit{rate, d}
	}
	return m, nil
}

// newServer returns the server for Redis at addr, loading the script in
// lua mode.
func newServer(addr, mode, limits string) (*server, error) {
	if mode != "lua" && mode != "pipe" && mode != "batch" && mode != "loop" {
		return nil, fmt.Errorf("mode %q: want lua, pipe, batch or loop", mode)
	}
	lm, err := parseLimits(limits)
	if err != nil {
		return nil, err
	}
	s := &server{addr: addr, lua: mode != "pipe", limits: lm, def: limit{1000, time.Second}, free: make(chan *conn, 256)}
	if mode == "batch" || mode == "loop" {
		s.batch = make(chan *job, maxBatch)
	}
	c, err := s.get()
	if err != nil {
		return nil, err
	}
	defer s.put(c)
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	writeCmd(c.w, "SCRIPT", "LOAD", floorLua)
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	if _, s.sha, err = readReply(c.r); err != nil {
		return nil, err
	}
	if mode == "loop" {
		writeCmd(c.w, "SCRIPT", "LOAD", floorLoop)
		if err := c.w.Flush(); err != nil {
			return nil, err
		}
		if _, s.loop, err = readReply(c.r); err != nil {
			return nil, err
		}
	}
	if s.batch != nil {
		go s.flushLoop()
	}
	return s, nil
}

func main() {
	grpcAddr := flag.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address")
	httpAddr := flag.String("http-addr", "127.0.0.1:8080", "HTTP listen address of GET /healthcheck")
	redisAddr := flag.String("redis-addr", "127.0.0.1:6379", "Redis address")
	mode := flag.String("mode", "lua", "lua: one EVALSHA of a minimal script; pipe: INCRBY and EXPIRE pipelined; batch: lua's commands, the requests in flight sharing round trips; loop: batch's round trips, one EVALSHA of a minimal loop script per flush")
	limits := flag.String("limits", "user=1000/1s hot=10/1h tb=1000/1s sw=1000/1s", "fixed windows per descriptor key: key=rate/period, space-separated")
	flag.Parse()
	if err := run(*grpcAddr, *httpAddr, *redisAddr, *mode, *limits); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM.
func run(grpcAddr, httpAddr, redisAddr, mode, limits string) error {
	s, err := newServer(redisAddr, mode, limits)
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		_ = gl.Close()
		return err
	}
	var opts []grpc.ServerOption
	if s.batch != nil {
		opts = batchServerOptions
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() {
		if err := hs.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err = <-errc:
	}
	gs.Stop()
	_ = hs.Close()
	return err
}
