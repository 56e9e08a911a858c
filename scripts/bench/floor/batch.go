package main

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// batchServerOptions are the gRPC transport options of batch mode:
// ratelimitd's (internal/listen's GRPC.ServerOptions), so that the floor of
// service CPU at c=50 pays no more transport work than ratelimitd does:
// calls on idle stream workers, fixed 1 MiB flow-control windows.
var batchServerOptions = []grpc.ServerOption{
	grpc.NumStreamWorkers(128),
	grpc.InitialWindowSize(1 << 20),
	grpc.InitialConnWindowSize(1 << 20),
}

// maxBatch bounds the requests of one flush in batch mode.
const maxBatch = 128

// job is one request's commands in batch mode, and its replies.
type job struct {
	cmds []byte   // RESP commands, one EVALSHA per descriptor
	n    int      // commands (replies to read)
	keys []string // loop mode: the counter keys, counted by the flush
	hits string   // loop mode: hits per key
	ttls []string // loop mode: each key's TTL in ms
	out  []int64  // counts, filled by the flush loop
	err  error
	done chan struct{}
}

var jobs = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

// flushLoop serves the batch channel: it takes every job waiting (up to
// maxBatch), writes their commands in one write, reads the replies and
// wakes each job.
func (s *server) flushLoop() {
	var batch []*job
	for j := range s.batch {
		batch = append(batch[:0], j)
	more:
		for len(batch) < maxBatch {
			select {
			case j := <-s.batch:
				batch = append(batch, j)
			default:
				break more
			}
		}
		if s.loop != "" {
			s.flushLoopScript(batch)
			continue
		}
		c, err := s.get()
		if err == nil {
			_ = c.c.SetDeadline(time.Now().Add(time.Second))
			for _, j := range batch {
				_, _ = c.w.Write(j.cmds)
			}
			if err = c.w.Flush(); err != nil {
				_ = c.c.Close()
			}
		}
		if err != nil {
			for _, j := range batch {
				j.err = err
				j.done <- struct{}{}
			}
			continue
		}
		for _, j := range batch {
			j.out, j.err = j.out[:0], err
			for i := 0; i < j.n && j.err == nil; i++ {
				n, _, err := readReply(c.r)
				j.out, j.err = append(j.out, n), err
			}
			if j.err != nil {
				err = j.err
			}
			j.done <- struct{}{}
		}
		if err != nil {
			_ = c.c.Close()
			continue
		}
		s.put(c)
	}
}

// loopGroup is the keys of one floorLoop call: one hits and TTL.
type loopGroup struct {
	hits, ttl string
	keys      []string
	out       []*int64 // where each key's count goes
}

// flushLoopScript decides a batch in loop mode: one EVALSHA of floorLoop
// per hits and TTL among the batch's keys (one in the benchmark), all in
// one write, then the counts back to each job.
func (s *server) flushLoopScript(batch []*job) {
	var groups []*loopGroup
	for _, j := range batch {
		// sized before any pointer into it is taken
		j.out, j.err = append(j.out[:0], make([]int64, len(j.keys))...), nil
		for i := range j.keys {
			var g *loopGroup
			for _, x := range groups {
				if x.hits == j.hits && x.ttl == j.ttls[i] {
					g = x
					break
				}
			}
			if g == nil {
				g = &loopGroup{hits: j.hits, ttl: j.ttls[i]}
				groups = append(groups, g)
			}
			g.keys = append(g.keys, j.keys[i])
			g.out = append(g.out, &j.out[i])
		}
	}
	fail := func(err error) {
		for _, j := range batch {
			j.err = err
			j.done <- struct{}{}
		}
	}
	c, err := s.get()
	if err != nil {
		fail(err)
		return
	}
	_ = c.c.SetDeadline(time.Now().Add(time.Second))
	var b []byte
	for _, g := range groups {
		args := append(append([]string{"EVALSHA", s.loop, strconv.Itoa(len(g.keys))}, g.keys...), g.hits, g.ttl)
		b = appendCmd(b[:0], args...)
		_, _ = c.w.Write(b)
	}
	if err = c.w.Flush(); err == nil {
		for _, g := range groups {
			var ns []int64
			if ns, err = readInts(c.r); err != nil {
				break
			}
			if len(ns) != len(g.out) {
				err = fmt.Errorf("floor: %d counts for %d keys", len(ns), len(g.out))
				break
			}
			for i, n := range ns {
				*g.out[i] = n
			}
		}
	}
	if err != nil {
		_ = c.c.Close()
		fail(err)
		return
	}
	s.put(c)
	for _, j := range batch {
		j.done <- struct{}{}
	}
}

// readInts reads an array reply of integers.
func readInts(r *bufio.Reader) ([]int64, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if strings.HasPrefix(line, "-") {
		return nil, errReply(line[1:])
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("floor: unexpected reply %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil {
		return nil, err
	}
	ns := make([]int64, n)
	for i := range ns {
		if ns[i], _, err = readReply(r); err != nil {
			return nil, err
		}
	}
	return ns, nil
}

// appendCmd appends one RESP command to b.
func appendCmd(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, "\r\n"...)
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// shouldRateLimitBatch is ShouldRateLimit in batch mode.
func (s *server) shouldRateLimitBatch(req *rlsv3.RateLimitRequest, hits string, keys []string, lims []limit) (*rlsv3.RateLimitResponse, error) {
	j := jobs.Get().(*job)
	j.cmds, j.n = j.cmds[:0], len(keys)
	if s.loop != "" {
		j.keys, j.hits, j.ttls = keys, hits, j.ttls[:0]
		for _, l := range lims {
			j.ttls = append(j.ttls, strconv.FormatInt(l.period.Milliseconds(), 10))
		}
	} else {
		for i, k := range keys {
			j.cmds = appendCmd(j.cmds, "EVALSHA", s.sha, "1", k, hits, strconv.FormatInt(lims[i].period.Milliseconds(), 10))
		}
	}
	s.batch <- j
	<-j.done
	defer jobs.Put(j)
	if j.err != nil {
		return nil, j.err
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i, n := range j.out {
		if n > lims[i].rate {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	return resp, nil
}
