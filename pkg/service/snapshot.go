package service

import (
	"github.com/dunglas/httpsfv"

	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// snapshot is one policy Set with what the hot path derives from it,
// computed once by SetPolicy instead of on every request: the
// RateLimit-Policy item of every Spec and per rule and domain the metric
// children (looked up lazily, on first use, so that /metrics shows the
// same series as without the cache).
type snapshot struct {
	set     *policy.Set
	specs   map[*policy.Spec]*specInfo
	rules   map[*policy.Rule]*ruleInfo
	domains map[string]*domainInfo
}

func newSnapshot(set *policy.Set) *snapshot {
	sn := &snapshot{
		set:     set,
		specs:   map[*policy.Spec]*specInfo{},
		rules:   map[*policy.Rule]*ruleInfo{},
		domains: map[string]*domainInfo{},
	}
	for _, d := range set.Domains() {
		sn.domains[d] = &domainInfo{label: d}
	}
	for _, r := range set.Rules() {
		ri := &ruleInfo{}
		sn.rules[r] = ri
		for k := range r.Limits {
			sp := &r.Limits[k]
			sn.specs[sp] = newSpecInfo(r, sp)
		}
		// A variant (cgnat, reserve) has its own limits and shares the
		// metric children of its rule.
		for _, v := range r.Variants() {
			sn.rules[v] = ri
			for k := range v.Limits {
				sp := &v.Limits[k]
				sn.specs[sp] = newSpecInfo(v, sp)
			}
		}
	}
	return sn
}

// spec returns the cached specInfo of sp (a Limit of r), or a new one for
// a Spec outside the snapshot (a request limit override).
func (sn *snapshot) spec(r *policy.Rule, sp *policy.Spec) *specInfo {
	if in, ok := sn.specs[sp]; ok {
		return in
	}
	return newSpecInfo(r, sp)
}

// specInfo is what the response needs of one Spec independently of the
// decision.
type specInfo struct {
	// name is the policy name made safe for an RFC 9651 String (see
	// policyName).
	name string
	// quoted is name serialized as an RFC 9651 sf-string (quotes,
	// backslash escapes).
	quoted string
	// policyItem is the RateLimit-Policy list member
	// (draft-ietf-httpapi-ratelimit-headers-10 §5):
	// quoted;q=<rate>;w=<window seconds> or quoted;q=<rate>;qu="concurrent-requests".
	// policyOK is false when an integer is outside RFC 9651's range (the
	// header is then omitted, as httpsfv.Marshal fails).
	policyItem string
	policyOK   bool
}

// newSpecInfo serializes the static parts of a limit's header items once
// per config load, with httpsfv (RFC 9651): the quoted policy name and the
// whole RateLimit-Policy item. Only the RateLimit item's integers (r, t)
// are written per request (appendSFIntParam).
func newSpecInfo(r *policy.Rule, sp *policy.Spec) *specInfo {
	n := specPolicyName(r, sp)
	in := &specInfo{name: n}
	name := httpsfv.NewItem(n)
	quoted, err := httpsfv.Marshal(name)
	if err != nil { // not reachable: policyName yields printable ASCII
		quoted = `"_"`
	}
	in.quoted = quoted
	item := httpsfv.NewItem(n)
	item.Params.Add("q", sp.Limit.Rate)
	if sp.Limit.Kind == algo.Concurrency {
		item.Params.Add("qu", "concurrent-requests")
	} else {
		item.Params.Add("w", atLeast1(ceilSeconds(window(sp))))
	}
	pol, err := httpsfv.Marshal(item)
	in.policyItem, in.policyOK = pol, err == nil // out-of-range Integer: header omitted
	return in
}

// sfIntMax is the largest magnitude of an RFC 9651 Integer (§3.3.1).
const sfIntMax = 999_999_999_999_999

// appendSFIntParam appends ";key=n" and reports whether n is a valid RFC
// 9651 Integer (per-request integers of the RateLimit item; everything
// else is serialized by httpsfv in newSpecInfo).
func appendSFIntParam(b []byte, key string, n int64) ([]byte, bool) {
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, '=')
	return strconv.AppendInt(b, n, 10), n >= -sfIntMax && n <= sfIntMax
}

// ruleInfo caches the ratelimitd_decisions_total children of one rule
// (labels rule.Domain, rule.Path, result).
type ruleInfo struct {
	decisions [numResults]lazyCounter
	// ref caches the statsd stats of the rule's config key (refStats).
	ref atomic.Pointer[refKeyStats]
}

// domainInfo caches the ratelimitd_requests_total children of one domain
// label.
type domainInfo struct {
	label    string
	requests [numCodes]lazyCounter
}

// Result and code indices of the cached counters.
const (
	idxOK = iota
	idxNearLimit
	idxOverLimit
	idxShadow
	idxFailedOpen
	idxFailedClosed
	numResults
)

var resultLabels = [numResults]string{resultOK, resultNearLimit, resultOverLimit, resultShadow, resultFailedOpen, resultFailedClosed}

const (
	codeOK = iota
	codeOverLimit
	codeInvalidArgument
	codeUnavailable
	codeDeadlineExceeded
	numCodes
)

var codeLabels = [numCodes]string{"ok", "over_limit", "invalid_argument", "unavailable", "deadline_exceeded"}

// lazyCounter holds a CounterVec child once it was first used. Vectors
// whose children it caches are never Reset.
type lazyCounter struct {
	p atomic.Pointer[prometheus.Counter]
}

func (l *lazyCounter) get(vec *prometheus.CounterVec, lvs ...string) prometheus.Counter {
	if c := l.p.Load(); c != nil {
		return *c
	}
	c := vec.WithLabelValues(lvs...)
	l.p.Store(&c)
	return c
}

// lazyObserver is lazyCounter for a HistogramVec child.
type lazyObserver struct {
	p atomic.Pointer[prometheus.Observer]
}

func (l *lazyObserver) get(vec *prometheus.HistogramVec, lvs ...string) prometheus.Observer {
	if o := l.p.Load(); o != nil {
		return *o
	}
	o := vec.WithLabelValues(lvs...)
	l.p.Store(&o)
	return o
}

// count increments ratelimitd_requests_total{domain=d.label, code}.
func (d *domainInfo) count(m *metrics, code int) {
	d.requests[code].get(m.requests, d.label, codeLabels[code]).Inc()
}
