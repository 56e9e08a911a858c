package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// Resetter is optionally implemented by a Store that can delete counters
// (the memory, Redis and memcached backends). Service.Reset uses it.
type Resetter interface {
	// Reset deletes the counter state of every hit, so that the next Take
	// on the same Key starts from a full quota. Only Key and Limit are read;
	// a key without state is not an error. It is not atomic across hits,
	// and its errors should carry a Cause like Take's. A wrapping Store
	// returns an error wrapping errors.ErrUnsupported when the wrapped one
	// has no Reset.
	Reset(ctx context.Context, hits []algo.Hit) error
}

// ErrResetUnsupported is returned by Service.Reset when the Store does
// not implement Resetter. It wraps errors.ErrUnsupported, which a
// wrapping Store's Reset returns for a wrapped Store without one.
var ErrResetUnsupported = fmt.Errorf("service: the store cannot reset counters: %w", errors.ErrUnsupported)

// Admin operation and result labels of ratelimitd_admin_requests_total.
const (
	adminExplain = "explain"
	adminReset   = "reset"

	adminOK          = "ok"
	adminInvalid     = "invalid"
	adminUnavailable = "unavailable"
	adminError       = "error"
	adminNotFound    = "unknown_domain"
)

// maxListedDomains bounds the loaded domains an unknown-domain error
// lists; the rest are counted.
const maxListedDomains = 20

// Explanation is the answer of Service.Explain (JSON field names as
// tagged; the admin gRPC service returns the same document as a
// google.protobuf.Struct).
type Explanation struct {
	// Domain is the request's domain.
	Domain string `json:"domain"`
	// Code is the overall code ShouldRateLimit would answer now for this
	// request (its hits_addend included), "OK" or "OVER_LIMIT", before
	// global shadow mode; nothing was consumed to find it.
	Code string `json:"code"`
	// GlobalShadowMode: --shadow-mode is on, so an OVER_LIMIT Code would
	// be answered as OK.
	GlobalShadowMode bool `json:"global_shadow_mode,omitempty"`
	// Denying lists the limits that would deny, as "descriptor
	// index/policy name".
	Denying []string `json:"denying"`
	// Descriptors explain the request's descriptors, one each, in
	// request order.
	Descriptors []ExplainedDescriptor `json:"descriptors"`
}

// ExplainedDescriptor is one request descriptor in an Explanation.
type ExplainedDescriptor struct {
	// Index is the descriptor's 0-based position in the request.
	Index int `json:"index"`
	// Entries are the descriptor's entries: keys only, or "key=value"
	// when Options.LogValues (--key-values=clear).
	Entries []string `json:"entries"`
	// Matched: a rule (or a request limit override) answers the
	// descriptor.
	Matched bool `json:"matched"`
	// Rule is the matched rule's stat key (policy.Rule.Path, config
	// values only), LabelOverride for a request limit override; "" when
	// not Matched.
	Rule string `json:"rule,omitempty"`
	// Override: a request limit override (RateLimitDescriptor.limit)
	// answers the descriptor.
	Override bool `json:"override,omitempty"`
	// Unlimited: the matched rule is unlimited: true.
	Unlimited bool `json:"unlimited,omitempty"`
	// Shadow: the descriptor is in shadow mode (the rule's shadow_mode;
	// never for an override).
	Shadow bool `json:"shadow_mode,omitempty"`
	// Quota: the descriptor is in quota mode (the rule's quota_mode or
	// --quota-mode).
	Quota bool `json:"quota_mode,omitempty"`
	// Release: the descriptor is a concurrency lease release
	// (policy.Match.Release), always allowed.
	Release bool `json:"release,omitempty"`
	// Cost is the descriptor's hits_addend (the request's, or 1).
	Cost int64 `json:"cost"`
	// WouldDeny: some limit of the descriptor has fewer than Cost units
	// left (the descriptor's status would be OVER_LIMIT unless shadow).
	WouldDeny bool `json:"would_deny"`
	// Limits are the limits applied to the descriptor (after
	// `replaces`), in config order.
	Limits []ExplainedLimit `json:"limits,omitempty"`
}

// ExplainedLimit is one applied limit of a descriptor, read with a
// check-only hit (cost 0: nothing consumed).
type ExplainedLimit struct {
	// Name is rate_limit.name ("" when absent); Policy the name in the
	// RateLimit headers.
	Name string `json:"name,omitempty"`
	// Policy is the limit's name in the RateLimit and RateLimit-Policy
	// headers.
	Policy string `json:"policy"`
	// Algorithm is the config name of the algorithm ("fixed_window", see
	// policy.AlgorithmName).
	Algorithm string `json:"algorithm"`
	// RequestsPerUnit is rate_limit.requests_per_unit, admitted per Unit
	// × UnitMultiplier.
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	// Unit is the Envoy RateLimitUnit name ("SECOND" … "YEAR").
	Unit string `json:"unit"`
	// UnitMultiplier is rate_limit.unit_multiplier; 0 (omitted) for 1.
	UnitMultiplier uint32 `json:"unit_multiplier,omitempty"`
	// Burst is rate_limit.burst, the token bucket capacity; 0 (omitted)
	// when absent.
	Burst int64 `json:"burst,omitempty"`
	// Key is the backend key as stored (hashed unless --key-values=clear;
	// memcached appends the window start).
	Key string `json:"key"`
	// Remaining is the whole units admissible now.
	Remaining int64 `json:"remaining"`
	// ResetAfterSeconds is the decision's ResetAfter in seconds
	// (microsecond precision), as a check reports it: not 0 for a key
	// with nothing stored (a fixed window reports its window's end).
	ResetAfterSeconds float64 `json:"reset_after_seconds"`
	// RetryAfterSeconds, when not 0, is the wait until one unit is
	// admissible (nothing remains now).
	RetryAfterSeconds float64 `json:"retry_after_seconds,omitempty"`
	// WouldDeny: Remaining < the descriptor's Cost.
	WouldDeny bool `json:"would_deny"`
}

// ResetResult is the answer of Service.Reset.
type ResetResult struct {
	// Domain is the request's domain.
	Domain string `json:"domain"`
	// Counters are the counters deleted, one per applied limit of every
	// matched descriptor.
	Counters []ResetCounter `json:"counters"`
}

// ResetCounter is one counter deleted by Service.Reset.
type ResetCounter struct {
	Index int    `json:"index"` // descriptor index in the request
	Rule  string `json:"rule"`  // Rule.Path
	// Policy is the limit's name in the RateLimit headers.
	Policy string `json:"policy"`
	Key    string `json:"key"` // backend key (hashed unless --key-values=clear)
}

// adminPlan matches req's descriptors as decide does (request limit
// overrides, `replaces`, concurrency releases) and builds one hit per
// applied limit, without the per-request scratch arrays of the hot path.
func (s *Service) adminPlan(sn *snapshot, req *rlsv3.RateLimitRequest) ([]descState, []algo.Hit) {
	set := sn.set
	domain := req.GetDomain()
	reqCost := algo.ClampCost(int64(req.GetHitsAddend()))
	if reqCost == 0 {
		reqCost = 1
	}
	hasDomain := set.HasDomain(domain)
	ds := make([]descState, len(req.GetDescriptors()))
	replaced := map[string]bool{}
	for i, d := range req.GetDescriptors() {
		st := &ds[i]
		st.cost = reqCost
		if h := d.GetHitsAddend(); h != nil {
			st.cost = int64(min(h.GetValue(), uint64(algo.MaxCost)))
		}
		entries := make([]policy.Entry, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, policy.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		s.matchDescriptor(st, set, domain, hasDomain, d, entries)
		if st.matched {
			for _, n := range st.match.Rule.Replaces {
				replaced[n] = true
			}
		}
	}
	var hits []algo.Hit
	for i := range ds {
		st := &ds[i]
		if !st.matched || st.match.Rule.Unlimited {
			continue
		}
		r := st.match.Rule
		for k := range r.Limits {
			sp := &r.Limits[k]
			if !applies(st, sp, replaced) {
				continue
			}
			st.applied = append(st.applied, applied{spec: sp, info: sn.spec(r, sp), hit: len(hits)})
			hits = append(hits, algo.Hit{Key: set.Key(st.match, k), Limit: sp.Limit, Soft: true})
		}
	}
	return ds, hits
}

// adminSnapshot validates req and returns the snapshot in force, or a
// gRPC status error (InvalidArgument, Unavailable before the first
// config).
func (s *Service) adminSnapshot(op string, req *rlsv3.RateLimitRequest) (*snapshot, error) {
	if err := validateRequest(req, s.answers); err != nil {
		s.m.admin.WithLabelValues(op, adminInvalid).Inc()
		return nil, err
	}
	sn := s.snap.Load()
	if sn == nil {
		s.m.admin.WithLabelValues(op, adminUnavailable).Inc()
		return nil, status.Error(codes.Unavailable, "service: no rate limit configuration loaded")
	}
	if d := req.GetDomain(); !sn.set.HasDomain(d) {
		s.m.admin.WithLabelValues(op, adminNotFound).Inc()
		return nil, status.Error(codes.NotFound, unknownDomain(d, sn.set.Domains()))
	}
	return sn, nil
}

// unknownDomain is the error message for a request on a domain the config
// in force lacks: ShouldRateLimit would match nothing and answer OK, so an
// explanation or a reset would only hide a misspelt or unloaded domain. It
// names the domain (cut to 128 bytes) and the loaded domains, at most
// maxListedDomains of them.
func unknownDomain(domain string, loaded []string) string {
	if len(domain) > 128 {
		domain = domain[:128] + "..."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "service: unknown domain %q: the config in force has no such domain; ShouldRateLimit matches nothing there and answers OK. Loaded domains (%d):", domain, len(loaded))
	for i, d := range loaded {
		if i == maxListedDomains {
			fmt.Fprintf(&b, " and %d more", len(loaded)-i)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %q", d)
	}
	return b.String()
}

// Explain says how the service would decide req now without consuming
// anything: per descriptor the matched rule, its limits with their backend
// keys, remaining units and reset times (read with check-only hits from the
// primary Store), and which limits would deny. Errors are gRPC status
// errors: InvalidArgument, NotFound for a domain the config in force
// lacks, Unavailable before the first config or when the Store fails (no
// failure mode applies to an explanation).
func (s *Service) Explain(ctx context.Context, req *rlsv3.RateLimitRequest) (*Explanation, error) {
	sn, err := s.adminSnapshot(adminExplain, req)
	if err != nil {
		return nil, err
	}
	ds, hits := s.adminPlan(sn, req)
	decs := make([]algo.Decision, len(hits))
	if len(hits) > 0 {
		if err := s.checkAll(ctx, ds, hits, decs); err != nil {
			s.m.admin.WithLabelValues(adminExplain, adminUnavailable).Inc()
			return nil, status.Errorf(codes.Unavailable, "service: explain: backend failed (%s): %v", causeOf(err), err)
		}
	}
	// A limit denies the request's cost when fewer units remain: the
	// decisions evaluate as the request's own would have.
	verdicts := make([]algo.Decision, len(decs))
	for i := range ds {
		for _, a := range ds[i].applied {
			verdicts[a.hit] = algo.Decision{Allowed: decs[a.hit].Allowed && decs[a.hit].Remaining >= ds[i].cost}
			if ds[i].match.Release {
				verdicts[a.hit].Allowed = true // a release is always allowed
			}
		}
	}
	denied := s.evaluate(ds, verdicts)
	ex := &Explanation{Domain: req.GetDomain(), Code: rlsv3.RateLimitResponse_OK.String(), GlobalShadowMode: s.opts.ShadowMode, Denying: []string{}}
	if denied {
		ex.Code = rlsv3.RateLimitResponse_OVER_LIMIT.String()
	}
	for i, d := range req.GetDescriptors() {
		st := &ds[i]
		ed := ExplainedDescriptor{Index: i, Entries: s.entryList(d.GetEntries()), Matched: st.matched, Cost: st.cost,
			Override: st.override, Shadow: st.shadow, Quota: st.quota, WouldDeny: st.denied}
		if st.matched {
			ed.Rule = st.match.Rule.Path
			ed.Unlimited = st.match.Rule.Unlimited
			ed.Release = st.match.Release
			if st.override {
				ed.Rule = LabelOverride
			}
		}
		for _, a := range st.applied {
			sp, dec := a.spec, decs[a.hit]
			el := ExplainedLimit{
				Name: sp.Name, Policy: a.info.name, Algorithm: policy.AlgorithmName(sp.Limit.Kind),
				RequestsPerUnit: sp.RequestsPerUnit, Unit: sp.Unit.String(), Burst: sp.Burst,
				Key: hits[a.hit].Key, Remaining: dec.Remaining, ResetAfterSeconds: seconds(dec.ResetAfter),
				RetryAfterSeconds: seconds(dec.RetryAfter), WouldDeny: !verdicts[a.hit].Allowed,
			}
			if sp.UnitMultiplier > 1 {
				el.UnitMultiplier = sp.UnitMultiplier
			}
			if el.WouldDeny {
				ex.Denying = append(ex.Denying, fmt.Sprintf("%d/%s", i, a.info.name))
			}
			ed.Limits = append(ed.Limits, el)
		}
		ex.Descriptors = append(ex.Descriptors, ed)
	}
	s.m.admin.WithLabelValues(adminExplain, adminOK).Inc()
	return ex, nil
}

// seconds is d in seconds, rounded to microseconds.
func seconds(d time.Duration) float64 {
	return math.Round(d.Seconds()*1e6) / 1e6
}

// Reset deletes the counters of every applied limit of req's matched
// descriptors (a support ticket, a good login after failed ones) on the
// primary Store and on the failure_mode local fallback, if any. It logs
// each counter with who (the peer address) and counts it in
// ratelimitd_counter_resets_total. Errors are gRPC status errors:
// InvalidArgument, NotFound (unknown domain), Unavailable (no config,
// Store failed), Unimplemented (ErrResetUnsupported).
func (s *Service) Reset(ctx context.Context, req *rlsv3.RateLimitRequest, who string) (*ResetResult, error) {
	sn, err := s.adminSnapshot(adminReset, req)
	if err != nil {
		return nil, err
	}
	ds, hits := s.adminPlan(sn, req)
	out := &ResetResult{Domain: req.GetDomain(), Counters: []ResetCounter{}}
	for i := range ds {
		for _, a := range ds[i].applied {
			rule := ds[i].match.Rule.Path
			if ds[i].override {
				rule = LabelOverride
			}
			out.Counters = append(out.Counters, ResetCounter{Index: i, Rule: rule, Policy: a.info.name, Key: hits[a.hit].Key})
		}
	}
	if len(hits) > 0 {
		err = s.resetStores(ctx, ds, hits)
		if err != nil {
			s.m.admin.WithLabelValues(adminReset, adminError).Inc()
			s.opts.Logger.Warn("admin reset failed", "who", who, "domain", req.GetDomain(), "keys", keysOf(out.Counters), "error", err)
			if errors.Is(err, errors.ErrUnsupported) {
				return nil, status.Error(codes.Unimplemented, err.Error())
			}
			return nil, status.Errorf(codes.Unavailable, "service: reset: backend failed (%s): %v", causeOf(err), err)
		}
	}
	s.m.admin.WithLabelValues(adminReset, adminOK).Inc()
	s.m.resets.Add(float64(len(out.Counters)))
	args := []any{"who", who, "domain", req.GetDomain()}
	if s.opts.LogValues {
		args = append(args, "entries", descriptorList(req, s.entryList))
	}
	for _, c := range out.Counters {
		s.opts.Logger.Info("admin reset: counter deleted", append(args, "descriptor", c.Index, "rule", c.Rule, "policy", c.Policy, "key", c.Key)...)
	}
	if len(out.Counters) == 0 {
		s.opts.Logger.Info("admin reset: no limit matched; nothing deleted", args...)
	}
	return out, nil
}

func keysOf(cs []ResetCounter) []string {
	ks := make([]string, len(cs))
	for i, c := range cs {
		ks[i] = c.Key
	}
	return ks
}
