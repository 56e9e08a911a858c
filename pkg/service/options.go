package service

import (
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/opterr"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// HeaderMode selects which rate-limit response headers the service adds to
// response_headers_to_add. The zero value HeadersIETF is the default.
type HeaderMode uint8

const (
	// HeadersIETF emits RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers-10, RFC 9651 lists).
	HeadersIETF HeaderMode = iota
	// HeadersLegacy emits three headers for one chosen limit, as
	// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED does: its
	// requests_per_unit, limit_remaining and seconds until reset, under
	// the names of Options.LegacyHeaderNames (X-RateLimit-Limit,
	// X-RateLimit-Remaining and X-RateLimit-Reset by default).
	HeadersLegacy
	// HeadersBoth emits the IETF and the legacy set.
	HeadersBoth
	// HeadersNone emits no rate-limit headers. Retry-After, Content-Type
	// and the problem body are still sent on OVER_LIMIT unless
	// Options.OmitProblem is set.
	HeadersNone
)

// String returns the flag spelling: "ietf", "legacy", "both" or "none".
func (m HeaderMode) String() string { return headerModes.String(m) }

// headerModes are the spellings of HeaderMode.
var headerModes = flagEnum[HeaderMode]{typ: "HeaderMode", what: "header mode", names: []string{"ietf", "legacy", "both", "none"}}

func (m HeaderMode) ietf() bool   { return m == HeadersIETF || m == HeadersBoth }
func (m HeaderMode) legacy() bool { return m == HeadersLegacy || m == HeadersBoth }

// ParseHeaderMode parses "ietf", "legacy", "both" or "none"
// (case-insensitive; "" means ietf).
func ParseHeaderMode(s string) (HeaderMode, error) { return headerModes.Parse(s) }

// LegacyHeaderNames are the names of the HeadersLegacy headers. An empty
// field takes its default: HeaderLegacyLimit, HeaderLegacyRemaining,
// HeaderLegacyReset. envoyproxy/ratelimit names them with
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER
// (defaults RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset).
type LegacyHeaderNames struct {
	Limit     string // requests_per_unit of the chosen limit
	Remaining string // limit_remaining of the chosen limit
	Reset     string // whole seconds until the chosen limit's window resets
}

// Defaults applied by New to zero-valued Options fields.
const (
	// DefaultNearLimitRatio is the share of a quota used after which an
	// allowed decision counts as near_limit (envoyproxy/ratelimit
	// NEAR_LIMIT_RATIO default).
	DefaultNearLimitRatio = 0.8
	// DefaultRetryJitter is the maximum jitter added to Retry-After.
	DefaultRetryJitter = time.Second
	// DefaultProblemTypeBase prefixes the problem type names
	// (RFC 9457 §3.1.1; IANA HTTP Problem Types registry).
	DefaultProblemTypeBase = "https://iana.org/assignments/http-problem-types#"
	// DefaultDetailedMetricCap bounds the number of distinct rule label
	// values that detailed_metric rules may create in the process's life;
	// further values are counted under the label "_other".
	DefaultDetailedMetricCap = 1000
	// DefaultFailClosedRetryAfter is the Retry-After base of a
	// failure_mode: closed denial (temporary-reduced-capacity).
	DefaultFailClosedRetryAfter = time.Second
)

// Options configure a Service. Zero values take the documented defaults;
// only Store is required.
type Options struct {
	// Store decides the hits of a request (memory or Redis backend).
	// Required.
	Store Store
	// Durable decides the limits with `store: durable` (policy.Spec.Store;
	// the PostgreSQL backend). A request with limits on both stores is
	// decided all or nothing across them (takeMixed: Store first, then
	// Durable, Store's hits refunded when Durable denies or fails closed).
	// nil: such limits fail with cause "unconfigured" (the loader refuses
	// them unless policy.LoadOptions.Durable says a durable store is
	// configured).
	Durable Store
	// Fallback is the in-process limiter used by rules with
	// failure_mode: local when Store (or Durable) fails. nil makes local behave as
	// open (logged).
	Fallback Store
	// Leases decides the hits of limits with consistency: leased from
	// the leases this instance holds (pkg/lease); nil decides them in
	// Store like the others.
	Leases Leaser
	// Registerer receives the service's metrics; nil disables metrics.
	Registerer prometheus.Registerer
	// Statsd, when not nil, receives envoyproxy/ratelimit's statsd stats
	// (docs/metrics.md, "statsd (reference names)"), counted where the
	// Prometheus metrics are; the caller runs and closes the client. nil
	// emits none.
	Statsd *statsd.Client
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// ShadowMode is the global shadow mode (--shadow-mode, SHADOW_MODE):
	// an OVER_LIMIT overall code is reported as OK; statuses keep
	// OVER_LIMIT (envoyproxy/ratelimit semantics).
	ShadowMode bool
	// QuotaMode treats every descriptor as quota_mode (QUOTA_MODE).
	QuotaMode bool
	// Counting is the global counting policy (--counting), for rules
	// without their own counting: policy.AllOrNothing (a denied request
	// consumes nothing) or policy.AlwaysCharge (every hit is charged,
	// even over the limit, as envoyproxy/ratelimit counts; post-paid
	// costs sent at stream end then stop the client that spent them).
	// The zero value policy.CountingDefault means AllOrNothing.
	Counting policy.Counting
	// Headers selects the response header set; zero is HeadersIETF.
	Headers HeaderMode
	// LegacyHeaderNames names the HeadersLegacy (and HeadersBoth) legacy
	// headers; zero fields take the X-RateLimit-* defaults.
	LegacyHeaderNames LegacyHeaderNames
	// OmitProblem leaves Retry-After, Content-Type and the RFC 9457
	// problem body (raw_body) out of OVER_LIMIT answers, as
	// envoyproxy/ratelimit does (it sends none of them). The zero value
	// sends them.
	OmitProblem bool
	// ReferenceAnswers answers as envoyproxy/ratelimit does where its
	// answers differ from ratelimitd's (reference mode):
	//   - a descriptor with no entries, or with an entry whose key is
	//     empty, matches nothing (status OK, no current_limit) instead of
	//     failing the call with InvalidArgument; an empty domain or
	//     descriptor list fails with codes.Unknown and the reference's
	//     message ("rate limit domain must not be empty", "rate limit
	//     descriptor list must not be empty"). The size bounds
	//     (MaxDescriptors, MaxEntries, MaxValueBytes) and an override unit
	//     outside the enum still fail with InvalidArgument; before the
	//     first config a call fails with codes.Unknown "no rate limit
	//     configuration loaded" instead of Unavailable;
	//   - a denied limit reports limit_remaining 0 (its status, and the
	//     legacy remaining header when it is the chosen limit), where
	//     ratelimitd reports what is left for a smaller request;
	//   - quota_mode descriptors never deny the request: when every one
	//     is over its limit the overall code stays OK (their statuses say
	//     OVER_LIMIT), where ratelimitd answers OVER_LIMIT.
	// The zero value keeps ratelimitd's answers.
	ReferenceAnswers bool
	// NearLimitRatio in (0, 1]: an allowed decision that leaves
	// used >= ratio × quota counts as near_limit. 0 means 0.8.
	NearLimitRatio float64
	// NearLimitHeader adds "Ratelimitd-Near-Limit", an RFC 9651 list of
	// the policy names past NearLimitRatio, to responses.
	NearLimitHeader bool
	// RetryJitter is the maximum jitter added on top of the exact wait in
	// Retry-After. 0 means 1s; negative disables jitter.
	RetryJitter time.Duration
	// FailClosedRetryAfter is the wait announced when failure_mode: closed
	// denies because the backend failed. 0 means 1s.
	FailClosedRetryAfter time.Duration
	// ProblemTypeBase is prepended to "quota-exceeded" and
	// "temporary-reduced-capacity" in the problem type. "" means
	// DefaultProblemTypeBase.
	ProblemTypeBase string
	// ProblemDetail, when not empty, is the problem "detail" template; the
	// placeholders {policy}, {quota}, {window} (seconds) and {retry_after}
	// (seconds) are replaced. "" uses a built-in sentence.
	ProblemDetail string
	// IgnoreRequestOverrides ignores RateLimitDescriptor.limit (the
	// request limit override, Envoy's descriptor "limit"). The zero value
	// honours it as envoyproxy/ratelimit does: when the domain exists, the
	// override replaces the config match (a rule's override: field may
	// still ignore, lower-only or cap it).
	IgnoreRequestOverrides bool
	// DynamicMetadata fills RateLimitResponse.dynamic_metadata as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	DynamicMetadata bool
	// DetailedMetricCap bounds the distinct rule label values that
	// detailed_metric rules may create in the process's life (reloads do
	// not grant it again); further values are counted under "_other".
	// 0 means DefaultDetailedMetricCap; negative is invalid.
	DetailedMetricCap int
	// DisableDetailedMetrics labels detailed_metric rules by Rule.Path,
	// as other rules, instead of by their descriptor values; the zero
	// value keeps detailed labels (bounded by DetailedMetricCap).
	DisableDetailedMetrics bool
	// MaxJSONBodyBytes bounds the body of a POST /json request, in bytes:
	// a longer body is refused with 413 before it is decoded. 0 means
	// DefaultMaxJSONBodyBytes; negative is invalid. Give it the gRPC
	// server's maximum received message size so that both ways in accept
	// the same requests.
	MaxJSONBodyBytes int
	// DecisionLog selects the decisions written to Logger as "decision"
	// lines (--log-decisions); zero is DecisionLogOff.
	DecisionLog DecisionLogMode
	// DecisionLogRate bounds the decision log, in lines per second (a
	// token bucket of that capacity; lines beyond it are dropped and
	// counted in ratelimitd_decision_log_suppressed_total and in the next
	// line's "suppressed"). 0 means DefaultDecisionLogRate; negative is
	// invalid.
	DecisionLogRate float64
	// LogValues lets descriptor values into the decision log, the admin
	// explanations and the reset log lines (--key-values=clear, where
	// backend keys carry them anyway). false shows entry keys only, and
	// backend keys are hashed.
	LogValues bool
	// Now is the clock for durations measured by the service; nil means
	// time.Now.
	Now func() time.Time
	// Rand returns a float in [0, 1) for Retry-After jitter; nil uses
	// math/rand/v2.
	Rand func() float64
}

// Validate reports every invalid field, joined, each a
// *opterr.FieldError: a nil Store; Headers beyond HeadersNone;
// NearLimitRatio outside [0, 1] or NaN; a negative FailClosedRetryAfter;
// DecisionLog beyond DecisionLogAll; a negative or NaN DecisionLogRate; a
// negative MaxJSONBodyBytes or DetailedMetricCap; Counting beyond
// policy.AlwaysCharge. Zero values are valid: they mean the defaults.
func (o Options) Validate() error {
	var errs []error
	bad := func(field string, v any, reason string) {
		errs = append(errs, &opterr.FieldError{Package: "service", Field: field, Value: v, Reason: reason})
	}
	if o.Store == nil {
		bad("Store", o.Store, "required")
	}
	if o.Headers > HeadersNone {
		bad("Headers", o.Headers, "unknown header mode")
	}
	if !(o.NearLimitRatio >= 0 && o.NearLimitRatio <= 1) {
		bad("NearLimitRatio", o.NearLimitRatio, "must be in [0, 1]")
	}
	if o.FailClosedRetryAfter < 0 {
		bad("FailClosedRetryAfter", o.FailClosedRetryAfter, "must be >= 0")
	}
	if o.DecisionLog > DecisionLogAll {
		bad("DecisionLog", o.DecisionLog, "unknown decision log mode")
	}
	if !(o.DecisionLogRate >= 0) {
		bad("DecisionLogRate", o.DecisionLogRate, "must be >= 0 lines per second")
	}
	if o.MaxJSONBodyBytes < 0 {
		bad("MaxJSONBodyBytes", o.MaxJSONBodyBytes, "must be >= 0")
	}
	if o.DetailedMetricCap < 0 {
		bad("DetailedMetricCap", o.DetailedMetricCap, "must be >= 0 (0: the default; DisableDetailedMetrics turns detailed labels off)")
	}
	if o.Counting > policy.AlwaysCharge {
		bad("Counting", o.Counting, "unknown counting policy")
	}
	return errors.Join(errs...)
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.NearLimitRatio == 0 {
		o.NearLimitRatio = DefaultNearLimitRatio
	}
	if o.RetryJitter == 0 {
		o.RetryJitter = DefaultRetryJitter
	} else if o.RetryJitter < 0 {
		o.RetryJitter = 0
	}
	if o.FailClosedRetryAfter == 0 {
		o.FailClosedRetryAfter = DefaultFailClosedRetryAfter
	}
	if o.ProblemTypeBase == "" {
		o.ProblemTypeBase = DefaultProblemTypeBase
	}
	// After the defaults a DetailedMetricCap of 0 means detailed labels
	// are off (the service's own reading).
	switch {
	case o.DisableDetailedMetrics:
		o.DetailedMetricCap = 0
	case o.DetailedMetricCap == 0:
		o.DetailedMetricCap = DefaultDetailedMetricCap
	}
	if o.MaxJSONBodyBytes == 0 {
		o.MaxJSONBodyBytes = DefaultMaxJSONBodyBytes
	}
	if o.LegacyHeaderNames.Limit == "" {
		o.LegacyHeaderNames.Limit = HeaderLegacyLimit
	}
	if o.LegacyHeaderNames.Remaining == "" {
		o.LegacyHeaderNames.Remaining = HeaderLegacyRemaining
	}
	if o.LegacyHeaderNames.Reset == "" {
		o.LegacyHeaderNames.Reset = HeaderLegacyReset
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.DecisionLogRate == 0 {
		o.DecisionLogRate = DefaultDecisionLogRate
	}
}
