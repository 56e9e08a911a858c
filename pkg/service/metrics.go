package service

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric label values that are not taken from the config.
const (
	// LabelUnknownDomain is the domain label of requests whose domain is
	// not in the loaded config (request values never become labels).
	LabelUnknownDomain = "_unknown"
	// LabelOther is the rule label of detailed_metric decisions beyond
	// Options.DetailedMetricCap distinct values.
	LabelOther = "_other"
	// LabelOverride is the rule label of decisions made by a request
	// limit override (RateLimitDescriptor.limit), whose stat key would
	// carry request values.
	LabelOverride = "_override"
)

// Decision results (label "result" of ratelimitd_decisions_total). They
// are exclusive: each counted descriptor decision has exactly one.
const (
	resultOK           = "ok"
	resultNearLimit    = "near_limit"
	resultOverLimit    = "over_limit"
	resultShadow       = "shadow"
	resultFailedOpen   = "failed_open"
	resultFailedClosed = "failed_closed"
)

// subMillisecondBuckets are latency buckets in seconds from 50 µs to 1 s.
var subMillisecondBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1,
}

type metrics struct {
	requests        *prometheus.CounterVec   // domain, code
	decisions       *prometheus.CounterVec   // domain, rule, result
	requestDuration prometheus.Histogram     // seconds
	backendDuration *prometheus.HistogramVec // store
	backendErrors   *prometheus.CounterVec   // cause
	reloads         *prometheus.CounterVec   // result
	configInfo      *prometheus.GaugeVec     // hash
	inflight        prometheus.Gauge
	unknownDomain   prometheus.Counter
	globalShadow    prometheus.Counter
	invalidUTF8     prometheus.Counter
	refunds         *prometheus.CounterVec // domain
	refundUnits     *prometheus.CounterVec // domain
	admin           *prometheus.CounterVec // op, result
	resets          prometheus.Counter
	// decisionLogSuppressed counts decision log lines over the rate bound.
	decisionLogSuppressed prometheus.Counter

	// children of backendDuration, created on first use
	primaryDuration, fallbackDuration lazyObserver
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_requests_total",
			Help: "ShouldRateLimit calls (gRPC and /json) by domain and final code (ok, over_limit, invalid_argument, unavailable). Unknown domains are labelled _unknown.",
		}, []string{"domain", "code"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_decisions_total",
			Help: "Descriptor decisions with a counted limit, by domain, rule (config stat key) and result (ok, near_limit, over_limit, shadow, failed_open, failed_closed).",
		}, []string{"domain", "rule", "result"}),
		requestDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_request_duration_seconds",
			Help:    "Time to answer one ShouldRateLimit call, in seconds.",
			Buckets: subMillisecondBuckets,
		}),
		backendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimitd_backend_duration_seconds",
			Help:    "Time of one Store.Take call, in seconds, by store (primary, fallback).",
			Buckets: subMillisecondBuckets,
		}, []string{"store"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_backend_errors_total",
			Help: "Store.Take errors by cause (the backend's bounded cause, timeout, canceled, fallback, other).",
		}, []string{"cause"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_config_reloads_total",
			Help: "Config loads by result: success (a changed config put in force), unchanged (same content as the config in force, nothing applied), failure (invalid config rejected), read_error (config files could not be read), watch_error (file watcher error).",
		}, []string{"result"}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_config_info",
			Help: "1 for the hash of the config in force (one series at a time).",
		}, []string{"hash"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_inflight_requests",
			Help: "ShouldRateLimit calls being answered.",
		}),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_unknown_domain_requests_total",
			Help: "Valid requests whose domain is not in the loaded config (answered OK without a limit).",
		}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_global_shadow_total",
			Help: "Requests whose OVER_LIMIT overall code global shadow mode turned into OK.",
		}),
		refunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_refunds_total",
			Help: "Descriptors with is_negative_hits whose hits_addend the store credited to their limits, by domain (config domains only).",
		}, []string{"domain"}),
		refundUnits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_refund_units_total",
			Help: "Units (hits_addend) of the descriptors counted in ratelimitd_refunds_total, by domain.",
		}, []string{"domain"}),
		invalidUTF8: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_invalid_utf8_requests_total",
			Help: "gRPC RateLimitRequests whose domain or descriptor entry key/value held invalid UTF-8 and were decoded with those strings escaped (U+FFFD + hex of the raw bytes) instead of failing.",
		}),
		admin: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_admin_requests_total",
			Help: "Admin explain and reset calls (debug listener, HTTP and gRPC) by op (explain, reset) and result (ok, invalid, unavailable, error).",
		}, []string{"op", "result"}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_counter_resets_total",
			Help: "Counters deleted by admin resets (one per applied limit of each matched descriptor).",
		}),
		decisionLogSuppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_decision_log_suppressed_total",
			Help: "Decision log lines (--log-decisions) dropped by the --log-decisions-rate bound.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{
		m.requests, m.decisions, m.requestDuration, m.backendDuration, m.backendErrors,
		m.reloads, m.configInfo, m.inflight, m.unknownDomain, m.globalShadow, m.invalidUTF8,
		m.refunds, m.refundUnits,
		m.admin, m.resets, m.decisionLogSuppressed,
	} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("service: register metrics: %w", err)
	}
	return m, nil
}

// labelCap hands out at most max distinct label values; later values get
// LabelOther. Safe for concurrent use.
type labelCap struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

func newLabelCap(max int) *labelCap { return &labelCap{max: max, seen: make(map[string]struct{})} }

func (c *labelCap) label(v string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		return LabelOther
	}
	c.seen[v] = struct{}{}
	return v
}
