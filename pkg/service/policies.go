package service

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// cgnatLogRate is the most cgnat decision log lines per second (the
// bucket holds one second's worth); the others are counted in the next
// line's "suppressed".
const cgnatLogRate = 1

// observeAddressPolicies counts the descriptors that cgnat raised
// (ratelimitd_cgnat_raised_total) and the non-critical ones a reserve
// share denied (ratelimitd_reserve_shed_total), and logs the cgnat
// decision, sampled by cgnatLog: msg "cgnat raised limit", attributes
// domain, rule, multiplier, key (the backend key of the first applied
// limit: hashed like every key, so no address reaches the log unless
// --key-values=clear) and suppressed.
func (s *Service) observeAddressPolicies(domain string, ds []descState, hits []algo.Hit, decs []algo.Decision, outs []outcome) {
	for i := range ds {
		st := &ds[i]
		if len(st.applied) == 0 || st.override {
			continue
		}
		r := st.match.Rule
		if r.Reduced && st.denied && !st.shadow && deniedByStore(st, decs, outs) {
			s.m.reserveShed.WithLabelValues(domain, r.Path).Inc()
		}
		if !r.Raised {
			continue
		}
		s.m.cgnatRaised.WithLabelValues(domain, r.Path).Inc()
		ok, suppressed := s.cgnatLog.take(s.opts.Now())
		if !ok {
			continue
		}
		s.opts.Logger.LogAttrs(context.Background(), slog.LevelInfo, "cgnat raised limit",
			slog.String("domain", domain),
			slog.String("rule", r.Path),
			slog.Int("multiplier", int(r.CGNAT.Multiplier)),
			slog.String("key", hits[st.applied[0].hit].Key),
			slog.Int64("suppressed", suppressed))
	}
}

// deniedByStore reports whether a limit of st was denied by a decision
// (the store's or the fallback's), not by a failure mode.
func deniedByStore(st *descState, decs []algo.Decision, outs []outcome) bool {
	for _, a := range st.applied {
		if !decs[a.hit].Allowed && (outs[a.hit] == byStore || outs[a.hit] == byFallback) {
			return true
		}
	}
	return false
}

// MaxSaturation bounds how long one SetSaturation marks a rule saturated;
// whatever sends the signal must renew it, so a forgotten mark ends.
const MaxSaturation = time.Hour

// saturationKey names a rule across reloads: its domain and stat key.
type saturationKey struct{ domain, rule string }

// SetSaturation marks the rule whose stat key is rule (Rule.Path) in
// domain saturated for d (at most MaxSaturation), or clears the mark when
// d <= 0. While marked, requests that are not critical under its reserve
// are decided against reserve.saturated_share. It returns the end of the
// mark (zero when cleared); the mark outlives reloads while its rule does.
// Errors: NotFound or InvalidArgument for a rule absent or without a
// saturated_share, Unavailable before the first config.
func (s *Service) SetSaturation(domain, rule string, d time.Duration) (time.Time, error) {
	sn := s.snap.Load()
	if sn == nil {
		return time.Time{}, status.Error(codes.Unavailable, "service: no config loaded yet")
	}
	if !sn.set.HasDomain(domain) {
		return time.Time{}, status.Errorf(codes.NotFound, "service: unknown domain %q", domain)
	}
	var found *policy.Rule
	for _, r := range sn.set.Rules() {
		if r.Domain == domain && r.Path == rule {
			found = r
			break
		}
	}
	if found == nil {
		return time.Time{}, status.Errorf(codes.NotFound, "service: domain %q has no rule %q", domain, rule)
	}
	if found.Reserve == nil || found.Reserve.SaturatedShare == 0 {
		return time.Time{}, status.Errorf(codes.InvalidArgument, "service: rule %q has no reserve with saturated_share", rule)
	}
	k := saturationKey{domain, rule}
	if d <= 0 {
		s.saturation.Delete(k)
		s.opts.Logger.Info("saturation cleared", "domain", domain, "rule", rule)
		return time.Time{}, nil
	}
	until := s.opts.Now().Add(min(d, MaxSaturation))
	s.saturation.Store(k, until)
	s.opts.Logger.Info("saturation set", "domain", domain, "rule", rule, "until", until.UTC().Format(time.RFC3339))
	return until, nil
}

// saturated reports whether rule r (a Reduced variant) of domain is
// marked saturated now.
func (s *Service) saturated(domain string, r *policy.Rule) bool {
	v, ok := s.saturation.Load(saturationKey{domain, r.Path})
	return ok && s.opts.Now().Before(v.(time.Time))
}

// SaturationRequest is the body of POST AdminSaturationPath: the rule's
// domain and stat key, and for how long ("30s"; "0s" clears the mark).
type SaturationRequest struct {
	Domain string `json:"domain"` // the rule's domain
	Rule   string `json:"rule"`   // the rule's stat key (policy.Rule.Path)
	For    string `json:"for"`    // a Go duration; "0s" (or negative) clears
}

// SaturationResult answers POST AdminSaturationPath: the mark's end,
// RFC 3339 in UTC, "" when cleared.
type SaturationResult struct {
	Domain string `json:"domain"`          // as requested
	Rule   string `json:"rule"`            // as requested
	Until  string `json:"saturated_until"` // RFC 3339 UTC end of the mark; "" when cleared
}

// saturationHandler serves AdminSaturationPath: POST a SaturationRequest.
func (s *Service) saturationHandler(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeAdminError(w, http.StatusMethodNotAllowed, r.URL.Path+" accepts POST only")
		return
	}
	var req SaturationRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, int64(s.opts.MaxJSONBodyBytes)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeAdminError(w, http.StatusBadRequest, "bad saturation request: "+err.Error())
		return
	}
	d, err := time.ParseDuration(req.For)
	if err != nil {
		writeAdminError(w, http.StatusBadRequest, "bad \"for\": "+err.Error())
		return
	}
	until, err := s.SetSaturation(req.Domain, req.Rule, d)
	res := SaturationResult{Domain: req.Domain, Rule: req.Rule}
	if !until.IsZero() {
		res.Until = until.UTC().Format(time.RFC3339)
	}
	writeAdmin(w, res, err)
}
