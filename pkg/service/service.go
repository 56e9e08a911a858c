// Package service implements the Envoy rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) and its
// HTTP twin POST /json: it validates a request, matches its descriptors
// against one policy snapshot, asks the Store once for all hits, applies
// the rules' failure modes when the Store fails, and builds the Envoy
// response: statuses, IETF RateLimit headers, Retry-After and an RFC 9457
// problem body.
//
// The package owns the Store interface; it never imports a concrete
// backend.
package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/loglimit"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Service answers ShouldRateLimit. It is safe for concurrent use; the
// policy snapshot is swapped atomically by SetPolicy.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	opts     Options
	answers  answerPolicy             // picked by Options.ReferenceAnswers
	snap     atomic.Pointer[snapshot] // nil before the first SetPolicy
	unknown  domainInfo               // requests of domains not in the config
	shutdown atomic.Bool
	m        *metrics
	detailed atomic.Pointer[labelCap]
	errLog   *loglimit.Limiter
	obs      observers   // the metrics' observers (newObservers)
	dlog     *lineBucket // nil with DecisionLogOff
	cgnatLog *lineBucket // bounds the cgnat decision log lines
	// saturation holds the rules marked saturated (SetSaturation):
	// saturationKey -> time.Time, the end of the mark.
	saturation sync.Map
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New validates opts, applies defaults and registers the metrics on
// opts.Registerer. The Service is not Ready until SetPolicy is called.
func New(opts Options) (*Service, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Service{opts: opts, answers: newAnswerPolicy(opts.ReferenceAnswers), m: m, errLog: loglimit.New(time.Second), unknown: domainInfo{label: LabelUnknownDomain}}
	s.detailed.Store(newLabelCap(max(opts.DetailedMetricCap, 0)))
	s.obs = newObservers(m, opts)
	if opts.DecisionLog != DecisionLogOff {
		s.dlog = newLineBucket(opts.DecisionLogRate, opts.Now())
	}
	s.cgnatLog = newLineBucket(cgnatLogRate, opts.Now())
	return s, nil
}

// SetPolicy swaps the policy snapshot in force (atomically; requests in
// flight finish on the snapshot they started with). A nil set is ignored.
// The detailed_metric label budget is the process's: a new config does not
// grant it again, so the labels stay bounded across reloads.
func (s *Service) SetPolicy(set *policy.Set) {
	if set == nil {
		return
	}
	s.snap.Store(newSnapshot(set))
}

// Policy returns the snapshot in force, nil before the first SetPolicy.
func (s *Service) Policy() *policy.Set {
	if sn := s.snap.Load(); sn != nil {
		return sn.set
	}
	return nil
}

// Ready reports whether a config has loaded and SetShuttingDown has not
// been called (gRPC health SERVING, /healthcheck 200).
func (s *Service) Ready() bool { return s.snap.Load() != nil && !s.shutdown.Load() }

// SetShuttingDown makes Ready report false from now on (graceful drain).
// Requests are still answered.
func (s *Service) SetShuttingDown() { s.shutdown.Store(true) }

// Register registers the service on g as envoy.service.ratelimit.v3.RateLimitService.
func (s *Service) Register(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// ReloadResult is the result label of ratelimitd_config_reloads_total.
type ReloadResult string

// Reload results; docs/config.md ("Reload") gives the rule.
const (
	// ReloadSuccess: a config whose content differs from the one in
	// force (or the first one) was loaded and put in force.
	ReloadSuccess ReloadResult = "success"
	// ReloadUnchanged: a load read the same content as the config in
	// force (same policy.Set.SourceHash); nothing was applied.
	ReloadUnchanged ReloadResult = "unchanged"
	// ReloadFailure: the config was read and rejected (invalid); the
	// previous one stays in force.
	ReloadFailure ReloadResult = "failure"
	// ReloadReadError: config files could not be read
	// (policy.IsReadError); the previous config stays in force.
	ReloadReadError ReloadResult = "read_error"
	// ReloadWatchError: the file watcher failed (a *policy.WatchError);
	// says nothing about the config.
	ReloadWatchError ReloadResult = "watch_error"
)

// ObserveReload records the outcome of one config load: CountReload with
// ReloadSuccess when ok, else ReloadFailure.
func (s *Service) ObserveReload(ok bool, set *policy.Set) {
	if !ok {
		s.CountReload(ReloadFailure, nil)
		return
	}
	s.CountReload(ReloadSuccess, set)
}

// CountReload records one config load or watcher event in
// ratelimitd_config_reloads_total{result=r} and, for ReloadSuccess with a
// non-nil set, sets ratelimitd_config_info{hash} to 1 for set.Hash() only.
// With statsd, success and unchanged also count
// ratelimit.service.config_load_success, failure and read_error
// ratelimit.service.config_load_error. It does not swap the policy: call
// SetPolicy as well.
func (s *Service) CountReload(r ReloadResult, set *policy.Set) {
	s.obs.configLoaded(r, set)
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer. Errors are gRPC
// status errors: InvalidArgument for a malformed request, Unavailable
// before the first config, DeadlineExceeded when the Store could not
// decide in time and only failure_mode open would have admitted the
// request (errUndecided). A backend failure is never an error: the rules'
// failure modes decide.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := s.opts.Now()
	s.m.inflight.Inc()
	defer func() {
		s.m.inflight.Dec()
		s.m.requestDuration.Observe(s.opts.Now().Sub(start).Seconds())
	}()
	sn := s.snap.Load()
	dom := &s.unknown
	if sn != nil {
		if di := sn.domains[req.GetDomain()]; di != nil {
			dom = di
		}
	}
	if err := validateRequest(req, s.answers); err != nil {
		dom.count(s.m, codeInvalidArgument)
		s.obs.requestRefused()
		return nil, err
	}
	if sn == nil {
		dom.count(s.m, codeUnavailable)
		s.obs.requestRefused()
		return nil, s.answers.noConfig()
	}
	if dom == &s.unknown {
		s.obs.unknownDomain(sn, req.GetDomain(), len(req.GetDescriptors()))
	}
	resp, err := s.decide(ctx, sn, req)
	if err != nil {
		dom.count(s.m, codeDeadlineExceeded)
		return nil, err
	}
	code := codeOK
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = codeOverLimit
	}
	dom.count(s.m, code)
	return resp, nil
}

// jitter returns a duration in [0, RetryJitter).
func (s *Service) jitter() time.Duration {
	if s.opts.RetryJitter <= 0 {
		return 0
	}
	f := rand.Float64
	if s.opts.Rand != nil {
		f = s.opts.Rand
	}
	r := f()
	if r < 0 || r >= 1 || math.IsNaN(r) {
		r = 0
	}
	return time.Duration(r * float64(s.opts.RetryJitter))
}

// causeDeadline and causeTimeout are the causes of a Store error for a
// call not decided within its budget, while the backend was answering
// (the Redis store's ErrDeadline) or had been silent (its ErrCallTimeout,
// and context deadlines).
const (
	causeDeadline = "deadline"
	causeTimeout  = "timeout"
	// causeCanceled is the cause of a Store error for a call whose caller
	// cancelled the request (context.Canceled).
	causeCanceled = "canceled"
)

// causeOf gives the bounded metric label of a Store error.
func causeOf(err error) string {
	var c Causer
	if errors.As(err, &c) {
		if v := c.Cause(); v != "" {
			return v
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return causeTimeout
	case errors.Is(err, context.Canceled):
		return causeCanceled
	}
	return "other"
}

// logBackendError logs a Store error under msg, at most once a second per
// cause, with the number of lines suppressed since the last one.
func (s *Service) logBackendError(cause string, err error, msg string) {
	if ok, n := s.errLog.Allow(cause, s.opts.Now()); ok {
		s.opts.Logger.Warn(msg, "cause", cause, "error", err, "suppressed", n)
	}
}

// String describes the service for logs: "service.Service(headers=MODE)"
// with the Options.Headers mode.
func (s *Service) String() string { return fmt.Sprintf("service.Service(headers=%s)", s.opts.Headers) }

// CountUnknownDomain counts one call of a domain not in the config that
// did not come through ShouldRateLimit (an RLQS stream, pkg/rlqs) in
// ratelimitd_unknown_domain_requests_total.
func (s *Service) CountUnknownDomain() { s.m.unknownDomain.Inc() }
