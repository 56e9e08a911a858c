package faults

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

const (
	// faultHold is how long a lasting fault (kill, freeze, OOM) lasts.
	faultHold = 3 * time.Second
	// quietAfter is the time without traffic after the end of a fault,
	// before the health is waited for and the call that must be counted.
	quietAfter = 3 * time.Second
	// stateWithin bounds, in real time, each wait for a health state
	// (NOT_SERVING after a fault began, SERVING after it ended):
	// generous, so that slow scheduling passes and an instance that never
	// gets there fails. How soon it happens is BenchmarkFaults' measure.
	stateWithin = 20 * time.Second
)

// fault is one way Redis fails. begin starts it; end ends it and returns
// once Redis answers again. A lasting fault holds for faultHold between
// them; restart is over when end returns.
type fault struct {
	name       string
	lasting    bool
	begin, end func(testing.TB, *redistest.Server)
}

var faultKinds = []fault{
	{"kill", true, func(_ testing.TB, s *redistest.Server) { s.Kill() }, func(_ testing.TB, s *redistest.Server) { s.Start(); s.WaitReady() }},
	{"freeze", true, func(_ testing.TB, s *redistest.Server) { s.Stop() }, func(_ testing.TB, s *redistest.Server) { s.Cont() }},
	{"restart", false, func(testing.TB, *redistest.Server) {}, func(_ testing.TB, s *redistest.Server) { s.Restart() }},
	{"oom", true, redistest.StartOOM, redistest.EndOOM},
}

// healthObs is one health check's answer.
type healthObs struct {
	at  time.Time
	st  healthpb.HealthCheckResponse_ServingStatus
	err error
}

// healthPoll checks one instance's health of a service every 10 ms in a
// goroutine until stopped.
type healthPoll struct {
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	obs   []healthObs
}

func (f *fleet) pollHealth(i int, service string) *healthPoll {
	h := &healthPoll{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for {
			select {
			case <-h.stopc:
				return
			default:
			}
			st, err := f.health(i, service)
			h.mu.Lock()
			h.obs = append(h.obs, healthObs{time.Now(), st, err})
			h.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return h
}

// stop ends the polling and returns every observation.
func (h *healthPoll) stop() []healthObs {
	close(h.stopc)
	<-h.done
	return h.obs
}

// serving reports whether o is a SERVING answer.
func (o healthObs) serving() bool {
	return o.err == nil && o.st == healthpb.HealthCheckResponse_SERVING
}

// timeline renders the status changes of obs as "offset:STATUS" from t0.
func timeline(obs []healthObs, t0 time.Time) string {
	var parts []string
	last := ""
	for _, o := range obs {
		s := o.st.String()
		if o.err != nil {
			s = "error(" + o.err.Error() + ")"
		}
		if s != last {
			parts = append(parts, fmt.Sprintf("%v:%s", o.at.Sub(t0).Round(time.Millisecond), s))
			last = s
		}
	}
	return strings.Join(parts, " ")
}

// traffic is goroutines calling ShouldRateLimit with Envoy's deadline on
// fresh values of the big rule until stopped.
type traffic struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	sum   tally
}

func (f *fleet) startTraffic(workers int) *traffic {
	tr := &traffic{stopc: make(chan struct{})}
	for w := range workers {
		tr.wg.Go(func() {
			var local tally
			defer func() { tr.mu.Lock(); tr.sum.merge(local); tr.mu.Unlock() }()
			for {
				select {
				case <-tr.stopc:
					return
				default:
				}
				resp, err := call(f.rls[w%len(f.rls)], "big", freshValue(), nil, envoyDeadline)
				local.add(resp, err)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return tr
}

// stop ends the traffic, waits for the calls in flight and returns the
// tally.
func (tr *traffic) stop() tally {
	close(tr.stopc)
	tr.wg.Wait()
	return tr.sum
}

// TestFaults: Redis (plain and TLS 1.3) is killed and restarted, frozen
// and thawed, restarted, or out of memory then freed, under one
// ratelimitd with default flags (plus patientArgs), idle or with two
// callers on Envoy's deadline. ratelimitd.backend must be NOT_SERVING
// through a lasting fault and SERVING after it; after quietAfter without
// traffic the next call on a fresh 1-per-day key is counted (OK, then
// OVER_LIMIT). How soon the health follows is BenchmarkFaults' measure.
func TestFaults(t *testing.T) {
	redistest.Require(t)
	for _, tls := range []bool{false, true} {
		top := "standalone"
		if tls {
			top = "tls13"
		}
		t.Run(top, func(t *testing.T) {
			for _, fk := range faultKinds {
				t.Run(fk.name, func(t *testing.T) {
					for _, busy := range []bool{false, true} {
						name := "idle"
						if busy {
							name = "busy"
						}
						t.Run(name, func(t *testing.T) {
							t.Parallel()
							runFault(t, fk, busy, tls)
						})
					}
				})
			}
		})
	}
}

// BenchmarkFaults measures runFault on standalone Redis, idle: how long
// after Redis answered again ratelimitd.backend was SERVING (serving_ms;
// docs/redis-operations.md "Recovery": within a second) and, for a lasting
// fault, how long after it began it was NOT_SERVING (down_ms).
func BenchmarkFaults(b *testing.B) {
	redistest.Require(b)
	for _, fk := range faultKinds {
		b.Run(fk.name, func(b *testing.B) {
			var serving, down time.Duration
			for range b.N {
				m := runFault(b, fk, false, false)
				serving, down = max(serving, m.serving), max(down, m.down)
			}
			b.ReportMetric(float64(serving.Milliseconds()), "serving_ms")
			if fk.lasting {
				b.ReportMetric(float64(down.Milliseconds()), "down_ms")
			}
		})
	}
}

// faultTimes are what runFault measured: NOT_SERVING after the fault
// began (lasting faults), SERVING after Redis answered again.
type faultTimes struct{ down, serving time.Duration }

func runFault(t testing.TB, fk fault, busy, tls bool) faultTimes {
	var srv *redistest.Server
	name := "standalone"
	if tls {
		// TLS 1.3 only, so that every connection, redials after the
		// fault included, negotiates it.
		srv, name = redistest.Standalone(t, redistest.WithTLS(), redistest.WithArgs("--tls-protocols", "TLSv1.3")), "tls13"
	} else {
		srv = redistest.Standalone(t)
	}
	t.Cleanup(srv.Cont) // never leave a frozen server to the cleanups
	f := startFleet(t, 1, writeConfig(t), standaloneBackend(name, srv), patientArgs...)
	f.warm(0)
	f.waitHealth(0, backendHealth, healthpb.HealthCheckResponse_SERVING, stateWithin)
	awayFromWindowEnd(t, time.Minute)

	hp := f.pollHealth(0, backendHealth)
	var tr *traffic
	if busy {
		tr = f.startTraffic(2)
		time.Sleep(300 * time.Millisecond) // the traffic runs before the fault
	}
	faultAt := time.Now()
	fk.begin(t, srv)
	if fk.lasting {
		// The fault lasts faultHold once the health has seen it.
		f.waitHealth(0, backendHealth, healthpb.HealthCheckResponse_NOT_SERVING, stateWithin)
		time.Sleep(faultHold)
	}
	var during tally
	if tr != nil {
		during = tr.stop()
	}
	endAt := time.Now()
	fk.end(t, srv)
	recoveredAt := time.Now()
	time.Sleep(quietAfter) // no traffic at all
	f.waitHealth(0, backendHealth, healthpb.HealthCheckResponse_SERVING, stateWithin)

	// The next call after the quiet time is counted: OK decided by the
	// store, and a second call on the 1-per-day key is OVER_LIMIT.
	v := freshValue()
	r1, err1 := call(f.rls[0], "l1", v, nil, 0)
	r2, err2 := call(f.rls[0], "l1", v, nil, 0)
	first, second := classify(r1, err1), classify(r2, err2)
	obs := hp.stop()

	t.Logf("%s: health of %s from the fault (ended %v after it, Redis answering %v after that): %s",
		fk.name, backendHealth, endAt.Sub(faultAt).Round(time.Millisecond), recoveredAt.Sub(endAt).Round(time.Millisecond), timeline(obs, faultAt))
	if busy {
		t.Logf("%s: calls during the fault: %v", fk.name, during)
	}
	t.Logf("%s: after %v without traffic: first call %v, second %v; backend errors by cause %v", fk.name, quietAfter, outcomeName(first, err1), outcomeName(second, err2), f.backendErrors())

	if first != okDecided || second != overLimit {
		t.Errorf("%s: after %v without traffic and SERVING, calls on a fresh 1-per-day key answered %v then %v; want OK decided by the store, then OVER_LIMIT (the first was counted)\n%s",
			fk.name, quietAfter, outcomeName(first, err1), outcomeName(second, err2), f.logs(20))
	}
	m := checkHealth(t, fk, obs, faultAt, endAt, recoveredAt)
	if t.Failed() {
		t.Logf("%s: the instance's log:\n%s", fk.name, f.logs(40))
	}
	return m
}

// checkHealth asserts the backend's health around a fault: during a
// lasting fault it turned NOT_SERVING and stayed so until the fault ended;
// after recovery it turned SERVING and stayed so. It returns when each
// happened.
func checkHealth(t testing.TB, fk fault, obs []healthObs, faultAt, endAt, recoveredAt time.Time) faultTimes {
	t.Helper()
	var m faultTimes
	for _, o := range obs {
		if o.err != nil {
			t.Errorf("%s: health check failed %v after the fault began: %v", fk.name, o.at.Sub(faultAt).Round(time.Millisecond), o.err)
			return m
		}
	}
	if fk.lasting {
		var down time.Time
		for _, o := range obs {
			if o.at.Before(faultAt) || !o.at.Before(endAt) {
				continue
			}
			if !o.serving() && down.IsZero() {
				down = o.at
			}
			if o.serving() && !down.IsZero() {
				t.Errorf("%s: %s SERVING again %v after the fault began, while Redis was still failing (NOT_SERVING from %v)",
					fk.name, backendHealth, o.at.Sub(faultAt).Round(time.Millisecond), down.Sub(faultAt).Round(time.Millisecond))
				break
			}
		}
		if down.IsZero() {
			t.Errorf("%s: %s never NOT_SERVING during the %v fault", fk.name, backendHealth, endAt.Sub(faultAt).Round(time.Millisecond))
		} else {
			m.down = down.Sub(faultAt)
			t.Logf("%s: %s NOT_SERVING %v after the fault began", fk.name, backendHealth, m.down.Round(time.Millisecond))
		}
	}
	var up time.Time
	for _, o := range obs {
		if o.at.Before(recoveredAt) {
			continue
		}
		if o.serving() && up.IsZero() {
			up = o.at
		}
		if !o.serving() && !up.IsZero() {
			t.Errorf("%s: %s NOT_SERVING again %v after Redis answered again (SERVING from %v)",
				fk.name, backendHealth, o.at.Sub(recoveredAt).Round(time.Millisecond), up.Sub(recoveredAt).Round(time.Millisecond))
			break
		}
	}
	if up.IsZero() {
		t.Errorf("%s: the health poll never saw %s SERVING after Redis answered again", fk.name, backendHealth)
	} else {
		m.serving = up.Sub(recoveredAt)
		t.Logf("%s: %s SERVING %v after Redis answered again", fk.name, backendHealth, m.serving.Round(time.Millisecond))
	}
	return m
}

// outcomeName describes an outcome of classify.
func outcomeName(o outcome, err error) string {
	switch o {
	case okDecided:
		return "OK (decided)"
	case okFailedOpen:
		return "OK (failed open)"
	case overLimit:
		return "OVER_LIMIT"
	}
	return "error " + err.Error()
}
