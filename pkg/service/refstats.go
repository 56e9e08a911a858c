package service

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// Stat name parts of envoyproxy/ratelimit (its src/stats, src/metrics):
// gostats joins scopes with '.'.
const (
	refRateLimitPrefix = "ratelimit.service.rate_limit."
	refServicePrefix   = "ratelimit.service."
	refCallPrefix      = "ratelimit.service.call.should_rate_limit."
	refServerPrefix    = "ratelimit_server."
)

// refStats is the observer that emits envoyproxy/ratelimit's statsd
// stats (docs/metrics.md, "statsd (reference names)"), from the same
// events as the Prometheus metrics. New adds it with Options.Statsd.
type refStats struct {
	c *statsd.Client
	// capN is Options.DetailedMetricCap, nearRatio Options.NearLimitRatio.
	capN      int
	nearRatio float64

	configLoadSuccess *statsd.Counter
	configLoadError   *statsd.Counter
	globalShadowMode  *statsd.Counter
	redisError        *statsd.Counter
	serviceError      *statsd.Counter

	// dyn holds the stats of keys that carry request values, bounded for
	// the process's life (reloads keep it).
	dyn atomic.Pointer[refDynamic]

	methods sync.Map // gRPC full method → *refMethod
}

// refKeyStats are the counters of one stat key
// (ratelimit.service.rate_limit.<key>.<stat>).
type refKeyStats struct {
	total, over, near, within, shadow *statsd.Counter
	// overLocal is over_limit_with_local_cache: hits over the limit
	// answered by the store's local over-limit cache
	// (algo.Decision.FromCache), also counted in over.
	overLocal *statsd.Counter
}

// refDynamic bounds the stat keys built from request values
// (value_to_metric levels, request limit overrides, unknown domains) to
// Options.DetailedMetricCap distinct keys for the process's life, like the
// detailed_metric labels of ratelimitd_decisions_total.
type refDynamic struct {
	cap  *labelCap
	keys sync.Map // key → *refKeyStats
	nf   sync.Map // domain → *statsd.Counter (domain_not_found)
}

type refMethod struct {
	total *statsd.Counter
	time  *statsd.Timer
}

// newRefStats returns the statsd observer, nil without a client.
func newRefStats(c *statsd.Client, capN int, nearRatio float64) *refStats {
	if c == nil {
		return nil
	}
	r := &refStats{
		c:                 c,
		capN:              capN,
		nearRatio:         nearRatio,
		configLoadSuccess: c.Counter(refServicePrefix + "config_load_success"),
		configLoadError:   c.Counter(refServicePrefix + "config_load_error"),
		globalShadowMode:  c.Counter(refServicePrefix + "global_shadow_mode"),
		redisError:        c.Counter(refCallPrefix + "redis_error"),
		serviceError:      c.Counter(refCallPrefix + "service_error"),
	}
	r.dyn.Store(&refDynamic{cap: newLabelCap(max(r.capN, 0))})
	return r
}

// configLoaded counts config_load_success (success, unchanged) or
// config_load_error (failure, read_error).
func (r *refStats) configLoaded(res ReloadResult, _ *policy.Set) {
	switch res {
	case ReloadSuccess, ReloadUnchanged:
		r.configLoadSuccess.Inc()
	case ReloadFailure, ReloadReadError:
		r.configLoadError.Inc()
	}
}

func (r *refStats) globalShadow() { r.globalShadowMode.Inc() }

// backendFailed counts redis_error for the primary store (the reference
// has no durable store).
func (r *refStats) backendFailed(role storeRole, _ string) {
	if role != roleDurable {
		r.redisError.Inc()
	}
}

func (r *refStats) requestRefused() { r.serviceError.Inc() }

// ipv4InName matches dotted IPv4 addresses, whose dots
// envoyproxy/ratelimit's SanitizeStatName turns into '_'.
var ipv4InName = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// refSanitize is envoyproxy/ratelimit's stat key sanitizing (':' and '|'
// become '_', and so do the dots of IPv4 addresses), plus what the line
// protocol needs (control characters become '_', see statsd.Sanitize) and
// invalid UTF-8 escaped as in labels.
func refSanitize(key string) string {
	key = validUTF8(key)
	if strings.ContainsAny(key, ":|") {
		key = strings.NewReplacer(":", "_", "|", "_").Replace(key)
	}
	key = ipv4InName.ReplaceAllStringFunc(key, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	return statsd.Sanitize(key)
}

func (r *refStats) newKeyStats(key string) *refKeyStats {
	p := refRateLimitPrefix + refSanitize(key) + "."
	return &refKeyStats{
		total:  r.c.Counter(p + "total_hits"),
		over:   r.c.Counter(p + "over_limit"),
		near:   r.c.Counter(p + "near_limit"),
		within: r.c.Counter(p + "within_limit"),
		shadow: r.c.Counter(p + "shadow_mode"),

		overLocal: r.c.Counter(p + "over_limit_with_local_cache"),
	}
}

// keyStats returns the stats of a key that may carry request values; the
// caller bounded it.
func (r *refStats) keyStats(key string) *refKeyStats {
	d := r.dyn.Load()
	if v, ok := d.keys.Load(key); ok {
		return v.(*refKeyStats)
	}
	ks := r.newKeyStats(key)
	v, _ := d.keys.LoadOrStore(key, ks)
	return v.(*refKeyStats)
}

// ruleStats returns the stats of rule r's config key (Rule.Path), cached
// on the snapshot's ruleInfo.
func (r *refStats) ruleStats(info *ruleInfo, rule *policy.Rule) *refKeyStats {
	if info == nil {
		return r.keyStats(rule.Path)
	}
	if ks := info.ref.Load(); ks != nil {
		return ks
	}
	ks := r.newKeyStats(rule.Path)
	info.ref.Store(ks)
	return ks
}

// statKey picks the stat key of a counted descriptor, mirroring the rule
// label of ratelimitd_decisions_total (label is that label): the rule's
// config key; for detailed_metric the request-value key or, past the cap,
// "<domain>._other"; for value_to_metric the request-value key within the
// cap, else the config key; for a request limit override the key of its
// entries within the cap, else "<domain>._override".
func (r *refStats) statKey(sn *snapshot, st *descState, label string) *refKeyStats {
	rule := st.match.Rule
	detailedOn := r.capN > 0
	switch {
	case st.override:
		if detailedOn {
			if k := r.dyn.Load().cap.label(st.match.MetricKey); k != LabelOther {
				return r.keyStats(k)
			}
		}
		return r.keyStats(rule.Domain + "." + LabelOverride)
	case rule.DetailedMetric && detailedOn && st.match.MetricKey != "":
		if label == LabelOther {
			return r.keyStats(rule.Domain + "." + LabelOther)
		}
		return r.keyStats(label)
	case detailedOn && !rule.DetailedMetric && st.match.MetricKey != "" && st.match.MetricKey != rule.Path:
		if k := r.dyn.Load().cap.label(st.match.MetricKey); k != LabelOther {
			return r.keyStats(k)
		}
	}
	return r.ruleStats(sn.rules[rule], rule)
}

// refHits splits the cost of one decision into envoyproxy/ratelimit's hit
// stats as its GetResponseDescriptorStatus does: an allowed request adds
// cost to within_limit and the part above the near-limit threshold to
// near_limit; a denied one adds the part above capacity to over_limit and
// the part between the threshold (or the usage before it) and capacity to
// near_limit. A backend failure answered open counts as within_limit, one
// answered closed as over_limit.
func (r *refStats) refHits(sp *policy.Spec, d algo.Decision, out outcome, cost int64) (within, over, near int64) {
	switch out {
	case byFailedOpen:
		return cost, 0, 0
	case byFailedClosed:
		return 0, cost, 0
	}
	c := capacity(sp.Limit)
	nearT := int64(float64(c) * r.nearRatio) // floor: both >= 0
	rem := min(max(d.Remaining, 0), c)
	if d.Allowed {
		after := c - rem
		before := max(after-cost, 0)
		if after > nearT {
			near = min(after-max(before, nearT), cost)
		}
		return cost, 0, near
	}
	before := c - rem
	after := before + cost
	if before >= c || after <= c {
		// All over (after <= c: a denial the counter alone does not
		// explain, e.g. a sliding window's weighted count or a token
		// bucket's rounding).
		return 0, cost, 0
	}
	over = after - c
	near = c - max(nearT, before)
	return 0, over, max(near, 0)
}

// decided adds one counted descriptor's hits to its stat key (label is
// its ratelimitd_decisions_total rule label). A descriptor whose deciding
// limit was answered by the store's local over-limit cache also adds its
// over_limit hits to over_limit_with_local_cache. A concurrency lease release
// and a refund (is_negative_hits) are no hits and add nothing.
func (r *refStats) decided(sn *snapshot, _ string, st *descState, label string, _ int, _ *ruleInfo, decs []algo.Decision, outs []outcome) {
	if st.match.Release || st.refund {
		return
	}
	ks := r.statKey(sn, st, label)
	cost := st.cost
	// The deciding limit: of a denied descriptor the denying limit with
	// the most hits over, else the limit with the most hits near.
	var within, over, near int64
	picked, local := false, false
	for _, a := range st.applied {
		d, o := decs[a.hit], outs[a.hit]
		denies := !d.Allowed
		if st.denied != denies {
			continue
		}
		w, ov, n := r.refHits(a.spec, d, o, cost)
		if !picked || ov > over || (ov == over && n > near) {
			within, over, near, picked = w, ov, n, true
			local = d.FromCache && o == byStore
		}
	}
	if !picked { // not reachable: a denied descriptor has a denying limit
		within = cost
	}
	ks.total.Add(uint64(cost))
	ks.within.Add(uint64(within))
	ks.over.Add(uint64(over))
	ks.near.Add(uint64(near))
	if local {
		ks.overLocal.Add(uint64(over))
	}
	if st.shadow {
		ks.shadow.Add(uint64(over))
	}
}

// unknownDomain counts n descriptors of a request whose domain is not in
// the config (ratelimit.service.rate_limit.<domain>.domain_not_found; the
// domain is bounded as a request-value key, "_unknown" past the cap). A
// domain literally named as the unknown-domain label that is in the
// config is not counted.
func (r *refStats) unknownDomain(sn *snapshot, domain string, n int) {
	if sn.set.HasDomain(domain) {
		return
	}
	d := r.dyn.Load()
	key := LabelUnknownDomain
	if r.capN > 0 {
		if k := d.cap.label("domain:" + domain); k != LabelOther {
			key = domain
		}
	}
	v, ok := d.nf.Load(key)
	if !ok {
		v, _ = d.nf.LoadOrStore(key, r.c.Counter(refRateLimitPrefix+refSanitize(key)+".domain_not_found"))
	}
	v.(*statsd.Counter).Add(uint64(n))
}

// UnaryServerInterceptor returns the gRPC interceptor that counts
// envoyproxy/ratelimit's per-method server stats,
// ratelimit_server.<method>.total_requests and
// ratelimit_server.<method>.response_time (milliseconds), for every unary
// call (ShouldRateLimit, and the health Check). nil when Options.Statsd is
// nil.
func (s *Service) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return s.obs.interceptor()
}

// interceptor counts the per-method server stats (UnaryServerInterceptor).
func (r *refStats) interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		m := r.method(info.FullMethod)
		m.total.Inc()
		resp, err := handler(ctx, req)
		m.time.Record(time.Since(start))
		return resp, err
	}
}

// method returns the stats of a registered gRPC method ("/pkg.Service/Method"
// → Method, as envoyproxy/ratelimit splits it; "unknown" when unparsable).
func (r *refStats) method(full string) *refMethod {
	if v, ok := r.methods.Load(full); ok {
		return v.(*refMethod)
	}
	name := "unknown"
	if _, m, ok := strings.Cut(strings.TrimPrefix(full, "/"), "/"); ok {
		name = m
	}
	p := refServerPrefix + refSanitize(name) + "."
	m := &refMethod{total: r.c.Counter(p + "total_requests"), time: r.c.Timer(p + "response_time")}
	v, _ := r.methods.LoadOrStore(full, m)
	return v.(*refMethod)
}
