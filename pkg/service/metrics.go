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
	earlyWarnings   *prometheus.CounterVec   // domain, rule
	penalties       *prometheus.CounterVec   // domain, rule
	penaltyDenied   *prometheus.CounterVec   // domain, rule
	requestDuration prometheus.Histogram     // seconds
	backendDuration *prometheus.HistogramVec // store
	backendErrors   *prometheus.CounterVec   // cause
	durableErrors   *prometheus.CounterVec   // cause
	durableRefunds  *prometheus.CounterVec   // result
	leasedRefunds   *prometheus.CounterVec   // result
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
	cgnatRaised           *prometheus.CounterVec // domain, rule
	reserveShed           *prometheus.CounterVec // domain, rule

	// children of backendDuration, created on first use
	primaryDuration, fallbackDuration, durableDuration lazyObserver
}

// newMetrics creates the service's metrics (docs/metrics.md lists them)
// and registers them with reg, in the order below; a nil reg registers
// nothing. The error joins every Register error (e.g. a name already
// registered by another collector).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var r registrar
	m := &metrics{
		requests:              r.counterVec("ratelimitd_requests_total", "ShouldRateLimit calls (gRPC and /json) by domain and final code (ok, over_limit, invalid_argument, unavailable). Unknown domains are labelled _unknown.", "domain", "code"),
		decisions:             r.counterVec("ratelimitd_decisions_total", "Descriptor decisions with a counted limit, by domain, rule (config stat key) and result (ok, near_limit, over_limit, shadow, failed_open, failed_closed).", "domain", "rule", "result"),
		earlyWarnings:         r.counterVec("ratelimitd_early_warning_total", "Keys whose usage of a limit crossed its early_warning share (default half of requests_per_unit) within the first part of the window (default a fifth), by domain and rule (config stat key); fixed and sliding windows.", "domain", "rule"),
		penalties:             r.counterVec("ratelimitd_penalties_total", "Penalty boxes started: a key denied penalty.after times within penalty.within, now blocked for penalty.block, by domain and rule (config stat key).", "domain", "rule"),
		penaltyDenied:         r.counterVec("ratelimitd_penalty_denied_total", "Hits denied by a penalty box's block in force (without deciding the limit), by domain and rule (config stat key).", "domain", "rule"),
		requestDuration:       r.histogram("ratelimitd_request_duration_seconds", "Time to answer one ShouldRateLimit call, in seconds."),
		backendDuration:       r.histogramVec("ratelimitd_backend_duration_seconds", "Time of one Store.Take call, in seconds, by store (primary, fallback, durable).", "store"),
		backendErrors:         r.counterVec("ratelimitd_backend_errors_total", "Store.Take errors by cause (the backend's bounded cause, timeout, canceled, fallback, other).", "cause"),
		durableErrors:         r.counterVec("ratelimitd_durable_errors_total", "Durable store (store: durable limits) Take errors by cause (the store's bounded cause, timeout, canceled, unconfigured, other); the failure modes of those limits applied.", "cause"),
		durableRefunds:        r.counterVec("ratelimitd_durable_refunds_total", "Requests whose fast-store hits were refunded because their durable limits denied or failed closed, by result (ok; error: the refund failed and those hits stay counted until their window ends).", "result"),
		leasedRefunds:         r.counterVec("ratelimitd_leased_refunds_total", "Requests a consistency: leased limit denied whose exact hits were refunded, by result (ok; error: the refund failed and those hits stay counted until their window ends).", "result"),
		reloads:               r.counterVec("ratelimitd_config_reloads_total", "Config loads by result: success (a changed config put in force), unchanged (same content as the config in force, nothing applied), failure (invalid config rejected), read_error (config files could not be read), watch_error (file watcher error).", "result"),
		configInfo:            r.gaugeVec("ratelimitd_config_info", "1 for the hash of the config in force (one series at a time).", "hash"),
		inflight:              r.gauge("ratelimitd_inflight_requests", "ShouldRateLimit calls being answered."),
		unknownDomain:         r.counter("ratelimitd_unknown_domain_requests_total", "Valid requests whose domain is not in the loaded config (answered OK without a limit), and RLQS streams whose domain is empty or not in the config (their buckets answered ALLOW_ALL)."),
		globalShadow:          r.counter("ratelimitd_global_shadow_total", "Requests whose OVER_LIMIT overall code global shadow mode turned into OK."),
		invalidUTF8:           r.counter("ratelimitd_invalid_utf8_requests_total", "gRPC RateLimitRequests whose domain or descriptor entry key/value held invalid UTF-8 and were decoded with those strings escaped (U+FFFD + hex of the raw bytes) instead of failing."),
		refunds:               r.counterVec("ratelimitd_refunds_total", "Descriptors with is_negative_hits whose hits_addend the store credited to their limits, by domain (config domains only).", "domain"),
		refundUnits:           r.counterVec("ratelimitd_refund_units_total", "Units (hits_addend) of the descriptors counted in ratelimitd_refunds_total, by domain.", "domain"),
		admin:                 r.counterVec("ratelimitd_admin_requests_total", "Admin explain and reset calls (debug listener, HTTP and gRPC) by op (explain, reset) and result (ok, invalid, unknown_domain, unavailable, error).", "op", "result"),
		resets:                r.counter("ratelimitd_counter_resets_total", "Counters deleted by admin resets (one per applied limit of each matched descriptor)."),
		decisionLogSuppressed: r.counter("ratelimitd_decision_log_suppressed_total", "Decision log lines (--log-decisions) dropped by the --log-decisions-rate bound."),
		cgnatRaised:           r.counterVec("ratelimitd_cgnat_raised_total", "Descriptors decided against a cgnat-raised limit (the value is an address in a cgnat range), by domain and rule (config stat key).", "domain", "rule"),
		reserveShed:           r.counterVec("ratelimitd_reserve_shed_total", "Descriptors that are not critical under a rule's reserve and were denied by the share of its limits they may use, by domain and rule (config stat key).", "domain", "rule"),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range r.cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("service: register metrics: %w", err)
	}
	return m, nil
}

// registrar creates metrics and keeps them, in creation order, for
// registration. Histograms use subMillisecondBuckets.
type registrar struct{ cs []prometheus.Collector }

// keep records c for registration and returns it.
func keep[C prometheus.Collector](r *registrar, c C) C {
	r.cs = append(r.cs, c)
	return c
}

func (r *registrar) counter(name, help string) prometheus.Counter {
	return keep(r, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func (r *registrar) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return keep(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func (r *registrar) gauge(name, help string) prometheus.Gauge {
	return keep(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func (r *registrar) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return keep(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

func (r *registrar) histogram(name, help string) prometheus.Histogram {
	return keep(r, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: subMillisecondBuckets}))
}

func (r *registrar) histogramVec(name, help string, labels ...string) *prometheus.HistogramVec {
	return keep(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: subMillisecondBuckets}, labels))
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
