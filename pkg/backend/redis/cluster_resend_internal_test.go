package redis

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	bclock "github.com/ratelimitd/ratelimitd/pkg/backend/clock"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// replyLossConn is a connection that, once drop is armed, loses the
// reply to the next script or function call (EVALSHA, FCALL) written on
// it: the reply is read off the
// socket (so the node has run the call), then the connection fails with
// io.EOF, as one cut between the node's reply and the client does.
type replyLossConn struct {
	net.Conn
	drop *atomic.Bool
	lose bool // the reply awaited is to be lost (used by one goroutine at a time)
}

func (c *replyLossConn) Write(b []byte) (int, error) {
	if lb := bytes.ToLower(b); (bytes.Contains(lb, []byte("evalsha")) || bytes.Contains(lb, []byte("fcall"))) &&
		c.drop.CompareAndSwap(true, false) {
		c.lose = true
	}
	return c.Conn.Write(b)
}

func (c *replyLossConn) Read(b []byte) (int, error) {
	if !c.lose {
		return c.Conn.Read(b)
	}
	if _, err := c.Conn.Read(b); err != nil {
		return 0, err
	}
	_ = c.Close()
	return 0, io.EOF
}

// TestClusterClientNoResendAfterLostReply: a Cluster client whose
// connection breaks after a node ran a script call (the reply lost) does
// not send the call again on another connection; go-redis' Cluster layer
// would, and the node would run it twice. A lone call and a pipeline.
func TestClusterClientNoResendAfterLostReply(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	o := DefaultOptions()
	o.Mode, o.URL, o.Addrs = Cluster, "", g.Addrs()
	var drop atomic.Bool
	c, err := newClient(o, dialHooks{wrap: func(_ string, tc *net.TCPConn) net.Conn {
		return &replyLossConn{Conn: tc, drop: &drop}
	}})
	if err != nil {
		t.Fatalf("newClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const src = "return redis.call('INCR', KEYS[1])"
	if err := c.ScriptLoad(ctx, src).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	sha := goredis.NewScript(src).Hash()
	keys := []string{"lostreply:{a}", "lostreply:{b}", "lostreply:{c}"}

	drop.Store(true)
	if err := c.EvalSha(ctx, sha, keys[:1]).Err(); err == nil {
		t.Errorf("EVALSHA whose reply was lost: no error")
	}
	drop.Store(true)
	cmds, _ := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.EvalSha(ctx, sha, keys[1:2])
		p.EvalSha(ctx, sha, keys[2:3])
		return nil
	})
	if drop.Load() {
		t.Fatalf("the pipeline's script calls were not sent")
	}
	failed := 0
	for _, cmd := range cmds {
		if cmd.Err() != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Errorf("pipeline whose reply was lost: no error")
	}
	for _, k := range keys {
		v, err := c.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		if n, _ := strconv.Atoi(v); n != 1 {
			t.Errorf("key %s: the script ran %s times, want 1 (one send)", k, v)
		}
	}
}

// TestClusterStoreCountsLostReplyOnce: a Cluster Store whose connection
// breaks after a master decided a Take (the reply lost) reports the Take
// failed, and the master counted it once: of the limit's 10, after a
// first Take and the lost one the burst that follows admits exactly 8.
// go-redis' Cluster layer would send the decision again on another
// connection, and the burst would admit 7. (The first Take creates the
// key, so that the lost call is one that counts.)
func TestClusterStoreCountsLostReplyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	g := redistest.Cluster(t, 3)
	o := DefaultOptions()
	o.Mode, o.URL, o.Addrs = Cluster, "", g.Addrs()
	o.HealthInterval = time.Minute
	var drop atomic.Bool
	// As newWithClock, with every socket losing a reply when drop is armed.
	clk := bclock.System{}
	live := newLiveness(o.Addrs, false)
	live.now, live.epoch = clk.Now, clk.Now()
	live.timeout = o.Timeout
	c, err := newClient(o, dialHooks{wrap: func(addr string, tc *net.TCPConn) net.Conn {
		return &replyLossConn{Conn: live.wrap(addr, tc), drop: &drop}
	}})
	if err != nil {
		t.Fatalf("newClient: %v", err)
	}
	s := newStore(c, o, clk)
	s.live, s.batch.live = live, live
	s.startHealth(o.HealthInterval)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	const limit, callers = 10, 30
	l := algo.Limit{Kind: algo.FixedWindow, Rate: limit, Period: time.Hour}
	hit := []algo.Hit{{Key: "lostreply:store", Limit: l, Cost: 1}}
	out := make([]algo.Decision, 1)
	if err := s.Take(ctx, hit, out); err != nil || !out[0].Allowed {
		t.Fatalf("first Take: %+v, %v; want allowed", out[0], err)
	}
	drop.Store(true)
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = s.Take(tctx, hit, out)
	cancel()
	if drop.Load() {
		t.Fatalf("the Take was not sent")
	}
	if err == nil {
		t.Errorf("Take whose reply was lost: no error (%+v)", out[0])
	}
	var allowed, denied, failed atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			d := make([]algo.Decision, 1)
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			switch err := s.Take(tctx, hit, d); {
			case err != nil:
				failed.Add(1)
			case d[0].Allowed:
				allowed.Add(1)
			default:
				denied.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != limit-2 || denied.Load() != callers-limit+2 || failed.Load() != 0 {
		t.Errorf("after the lost reply: allowed %d, denied %d, failed %d; want %d, %d, 0 (the lost Take counted once)",
			allowed.Load(), denied.Load(), failed.Load(), limit-2, callers-limit+2)
	}
}
