package service

import (
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// observer receives the service events that its metrics count. New picks
// the observers once: ratelimitd's Prometheus metrics (promObserver)
// always, envoyproxy/ratelimit's statsd stats (refStats) with
// Options.Statsd.
type observer interface {
	// configLoaded is one config load or watcher event (CountReload);
	// set is the config put in force with ReloadSuccess, else nil.
	configLoaded(r ReloadResult, set *policy.Set)
	// globalShadow is a denied request that global shadow mode answered OK.
	globalShadow()
	// backendFailed is one failed store call of role, cause its error's.
	backendFailed(role storeRole, cause string)
	// requestRefused is a call answered with an error before any
	// decision (a malformed request, or no config yet).
	requestRefused()
	// unknownDomain is a valid request of a domain not in the config.
	unknownDomain(sn *snapshot, domain string, descriptors int)
	// decided is one counted descriptor's decision in domain: label is
	// its ratelimitd_decisions_total rule label, result the index of its
	// result label, cached the rule's cached counters (nil for a label
	// built from request values).
	decided(sn *snapshot, domain string, st *descState, label string, result int, cached *ruleInfo, decs []algo.Decision, outs []outcome)
	// interceptor is the gRPC interceptor the observer needs, or nil.
	interceptor() grpc.UnaryServerInterceptor
}

// Both observers handle every event.
var (
	_ observer = promObserver{}
	_ observer = (*refStats)(nil)
)

// observers fans each event out to the Prometheus observer, then the
// statsd one. Its calls are static, not through observer, so that the
// request's descriptor states and decisions stay on the stack (and the
// events take separate arguments: a struct of them would leak the
// decisions with the labels).
type observers struct {
	prom promObserver
	ref  *refStats // nil without Options.Statsd
}

func newObservers(m *metrics, opts Options) observers {
	return observers{prom: promObserver{m}, ref: newRefStats(opts.Statsd, opts.DetailedMetricCap, opts.NearLimitRatio)}
}

func (o observers) configLoaded(r ReloadResult, set *policy.Set) {
	o.prom.configLoaded(r, set)
	if o.ref != nil {
		o.ref.configLoaded(r, set)
	}
}

func (o observers) globalShadow() {
	o.prom.globalShadow()
	if o.ref != nil {
		o.ref.globalShadow()
	}
}

func (o observers) backendFailed(role storeRole, cause string) {
	o.prom.backendFailed(role, cause)
	if o.ref != nil {
		o.ref.backendFailed(role, cause)
	}
}

func (o observers) requestRefused() {
	if o.ref != nil {
		o.ref.requestRefused()
	}
}

func (o observers) unknownDomain(sn *snapshot, domain string, n int) {
	o.prom.unknownDomain(sn, domain, n)
	if o.ref != nil {
		o.ref.unknownDomain(sn, domain, n)
	}
}

func (o observers) decided(sn *snapshot, domain string, st *descState, label string, result int, cached *ruleInfo, decs []algo.Decision, outs []outcome) {
	o.prom.decided(sn, domain, st, label, result, cached, decs, outs)
	if o.ref != nil {
		o.ref.decided(sn, domain, st, label, result, cached, decs, outs)
	}
}

// interceptor is the statsd observer's; Prometheus needs none.
func (o observers) interceptor() grpc.UnaryServerInterceptor {
	if o.ref != nil {
		return o.ref.interceptor()
	}
	return nil
}

// promObserver counts the events in ratelimitd's Prometheus metrics. A
// refused request is counted per domain with its code, where it is
// answered (domainInfo.count).
type promObserver struct{ m *metrics }

func (p promObserver) configLoaded(r ReloadResult, set *policy.Set) {
	p.m.reloads.WithLabelValues(string(r)).Inc()
	if r == ReloadSuccess && set != nil {
		p.m.configInfo.Reset()
		p.m.configInfo.WithLabelValues(set.Hash()).Set(1)
	}
}

func (p promObserver) globalShadow() { p.m.globalShadow.Inc() }

func (p promObserver) backendFailed(role storeRole, cause string) {
	p.m.errorsOf(role).WithLabelValues(cause).Inc()
}

func (promObserver) requestRefused() {}

func (p promObserver) unknownDomain(*snapshot, string, int) { p.m.unknownDomain.Inc() }

func (p promObserver) decided(_ *snapshot, domain string, _ *descState, label string, result int, cached *ruleInfo, _ []algo.Decision, _ []outcome) {
	if cached != nil {
		cached.decisions[result].get(p.m.decisions, domain, label, resultLabels[result]).Inc()
	} else {
		p.m.decisions.WithLabelValues(domain, label, resultLabels[result]).Inc()
	}
}

func (promObserver) interceptor() grpc.UnaryServerInterceptor { return nil }
