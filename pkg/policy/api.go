package policy

// This file fixes the API that pkg/service and cmd/ratelimitd build on.
// Signatures here are a contract between packages: extend, do not break.

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Unit is a rate_limit unit as envoyproxy/ratelimit spells it
// (case-insensitive in YAML). The zero value UnitUnknown is invalid.
type Unit uint8

// The units: the names and lengths of the Envoy
// RateLimitResponse.RateLimit.Unit enum (the numeric values are this
// package's own, ordered by length). Windows are epoch-aligned.
const (
	UnitUnknown Unit = iota // invalid: no unit given, or an unknown name
	Second                  // 1 s
	Minute                  // 60 s
	Hour                    // 3600 s
	Day                     // 86,400 s
	Week                    // 7 days
	Month                   // 30 days epoch-aligned, or a calendar month with calendar: true
	Year                    // 365 days epoch-aligned, or a calendar year with calendar: true
)

// FailureMode is what a limit does when the backend cannot decide (the
// rate_limit field failure_mode; docs/responses.md, "Backend failure").
// The zero value FailOpen allows.
type FailureMode uint8

const (
	FailOpen   FailureMode = iota // allow, counted as failed_open
	FailClosed                    // deny (temporary-reduced-capacity), counted as failed_closed
	FailLocal                     // decide with the in-process limiter
)

// StoreKind is the store that decides a limit (the rate_limit field
// store). The zero value StoreFast is the server's backend (memory,
// Redis or memcached).
type StoreKind uint8

const (
	// StoreFast: the server's backend decides the limit (config name
	// "fast", the default).
	StoreFast StoreKind = iota
	// StoreDurable: the durable store (PostgreSQL) decides it, so that
	// its count survives a restart or a flush of the fast store (config
	// name "durable"). Only windows of an hour or longer, of the
	// algorithms the durable store decides (LoadOptions.Durable).
	StoreDurable
)

// MinDurableWindow is the shortest window a `store: durable` limit may
// have: a durable decision costs a database write, which suits quotas
// over hours, days and months, not per-second limits.
const MinDurableWindow = time.Hour

// Consistency is how a limit is counted across instances (the rate_limit
// field consistency). The zero value Exact decides every hit in the store.
type Consistency uint8

const (
	// Exact: every hit is one store call (config name "exact", the
	// default).
	Exact Consistency = iota
	// Leased: each instance decides from units it leased from the store
	// in advance and renews them in the background (config name
	// "leased"; docs/leases.md). Never over the limit; fixed_window,
	// sliding_window and token_bucket only.
	Leased
)

// Counting is a counting policy: what a denied request consumes. The zero
// value CountingDefault defers to the service's global policy
// (--counting).
type Counting uint8

const (
	// CountingDefault: no counting on the rule; the global policy applies.
	CountingDefault Counting = iota
	// AllOrNothing: a denied request consumes nothing from any of its
	// limits (config name "all_or_nothing"; the global default).
	AllOrNothing
	// AlwaysCharge: every hit is charged, even when it is over the limit
	// or another descriptor denies the request, and each descriptor
	// reports its state after its own hit, as envoyproxy/ratelimit
	// counts hits_addend (config name "always_charge"; algo.Hit.Charge).
	AlwaysCharge
)

// Spec is one limit on a descriptor node: a `rate_limit:` object or one item
// of `rate_limits:`.
type Spec struct {
	// Name is rate_limit.name ("" when absent); echoed as current_limit.name
	// and the target of `replaces`.
	Name string
	// Policy is the name clients see in RateLimit/RateLimit-Policy headers:
	// Name when set, else a stable name derived from the config path (keys,
	// configured values, wildcard patterns; never request values), plus a
	// suffix for the 2nd.. item of rate_limits.
	Policy string
	// Unit is rate_limit.unit (never UnitUnknown in a loaded Set).
	Unit Unit
	// RequestsPerUnit is rate_limit.requests_per_unit, the units of cost
	// admitted per window (Envoy RateLimitResponse.RateLimit.requests_per_unit).
	RequestsPerUnit uint32
	// UnitMultiplier is rate_limit.unit_multiplier, the window length in
	// units (>= 1; 1 when absent).
	UnitMultiplier uint32
	// Algorithm is rate_limit.algorithm (algo.FixedWindow when absent,
	// the zero algo.Kind).
	Algorithm algo.Kind
	// Burst is rate_limit.burst, the token bucket capacity in units; 0
	// (absent, and always for other algorithms) means RequestsPerUnit.
	Burst int64
	// Calendar is rate_limit.calendar: a Month or Year window follows the
	// UTC calendar instead of 30 or 365 epoch-aligned days.
	Calendar bool
	// FailureMode is rate_limit.failure_mode (FailOpen when absent).
	FailureMode FailureMode
	// Consistency is rate_limit.consistency (Exact when absent).
	Consistency Consistency
	// Limit is the compiled algorithm input.
	Limit algo.Limit
	// EarlyWarning is rate_limit.early_warning: when a key crosses Used of
	// the limit within the first Within of its window (fixed_window and
	// sliding_window only; DefaultEarlyWarning when absent, the zero value
	// when off or for other algorithms).
	EarlyWarning EarlyWarning
	// Store is rate_limit.store: the store that decides the limit
	// (StoreFast when absent).
	Store StoreKind
	// Window is the quota window for RateLimit-Policy w= (unit × multiplier;
	// the calendar unit's nominal length when Calendar).
	Window time.Duration
}

// EarlyWarning is when a limit's key counts in
// ratelimitd_early_warning_total: its usage crosses Used × the limit while
// less than Within of its window has passed. Used == 0: off.
type EarlyWarning struct {
	// Used is the share of requests_per_unit to cross, in (0, 1]; 0 is
	// off.
	Used float64
	// Within is the share of the window at whose start a crossing counts,
	// in (0, 1].
	Within float64
}

// Rule is a descriptor node that answers a request descriptor: it carries
// `rate_limit`, `rate_limits` or `unlimited: true`. Rules are immutable.
type Rule struct {
	// Domain is the domain of the config file that holds the rule.
	Domain string
	// Path is the node's stat key as envoyproxy/ratelimit builds it:
	// "domain.k1_v1.k2" (value omitted where the config node has none;
	// wildcard nodes show their pattern). Bounded by the config.
	Path string
	// Name is the first limit's rate_limit.name ("" when absent; for an
	// unlimited rule, its rate_limit.name). For `replaces` matching, the
	// names of all Specs count.
	Name string
	// Limits are the limits of rate_limit (one) or rate_limits (in config
	// order); empty iff Unlimited.
	Limits []Spec
	// Unlimited is rate_limit.unlimited: the rule matches and answers OK
	// without counting.
	Unlimited bool
	// Replaces are the names of every limit's `replaces:` items: limits
	// of other matched descriptors with these names are not applied.
	Replaces []string
	// ShadowMode is the descriptor's shadow_mode: a denial is counted and
	// reported but the descriptor's status is OK.
	ShadowMode bool
	// QuotaMode is the descriptor's quota_mode (a soft limit): its
	// status reports OVER_LIMIT, but the request is denied only when
	// every quota-mode descriptor of it is over (docs/responses.md,
	// "overall_code").
	QuotaMode bool
	// DetailedMetric is the descriptor's detailed_metric: metrics label
	// the decision with the request values (Match.MetricKey) under a cap.
	DetailedMetric bool
	// Counting is the descriptor's `counting:` (all_or_nothing or
	// always_charge); CountingDefault when absent (the global policy).
	Counting Counting
	// Metadata is the node's `metadata:` map (JSON-compatible values), nil
	// when absent.
	Metadata map[string]any
	// File is the config file of the node (as Load found it, or the
	// Source name).
	File string
	// Line is the 1-based line of the node's mapping in File.
	Line int
	// CGNAT is the descriptor's `cgnat:` option, nil when absent.
	CGNAT *CGNAT
	// Reserve is the descriptor's `reserve:` option, nil when absent.
	Reserve *Reserve
	// Penalty is the descriptor's `penalty:` option, the penalty box of
	// each of its limits (the zero algo.Penalty when absent).
	Penalty algo.Penalty
	// Base is the config rule that this rule is a variant of, nil for a
	// config rule. Match returns a variant for a request that cgnat or
	// reserve decide against other limits: it shares everything with
	// Base but Limits (and, when Raised, the keys).
	Base *Rule
	// Raised marks the variant for addresses in CGNAT.Ranges: its limits
	// are multiplied by CGNAT.Multiplier and count on counters of their
	// own (Set.Key).
	Raised bool
	// Reduced marks the variant for requests that are not critical under
	// Reserve: its limits are floor(Reserve.Share × requests_per_unit),
	// counted on the same counters as the full limits.
	Reduced bool
	// Saturated marks the Reduced variant at Reserve.SaturatedShare
	// (Rule.SaturatedVariant).
	Saturated bool

	// nodes is the config path from the top level to this rule's node.
	nodes []*node
	// keyPre[i] is the canonical, length-prefixed encoding of (domain,
	// rule path, limit index i, algorithm, window) that starts every key
	// of Limits[i].
	keyPre [][]byte
	// needsPath: some node on the path has share_threshold or
	// value_to_metric, or the rule has detailed_metric.
	needsPath bool
	// override marks an ad hoc rule built by (*Set).Override.
	override bool
	// normalize: some node on the path has ipv6_prefix.
	normalize bool
	// raised and reduced are the variants (nil when the option is
	// absent); raised.reduced is the variant for both; saturated, on a
	// reduced variant, its saturated_share variant.
	raised, reduced, saturated *Rule
}

// Entry is one request descriptor entry (Envoy RateLimitDescriptor.Entry).
type Entry struct {
	// Key is the entry's key (RateLimitDescriptor.Entry.key).
	Key string
	// Value is the entry's value (RateLimitDescriptor.Entry.value); ""
	// matches only a value-less config node.
	Value string
}

// ReleaseKey is the key of the trailing entry that turns a descriptor into a
// concurrency lease release (see Match.Release).
const ReleaseKey = "ratelimitd.release"

// Match is a request descriptor resolved against a Set.
type Match struct {
	// Rule is the matched rule; nil only in the Match of (*Set).Override
	// when the override applies no limit.
	Rule *Rule
	// MetricKey is the stat key for this match (Rule.Path, or with
	// detailed_metric / value_to_metric the request-value form; for a
	// request limit override, envoyproxy/ratelimit's key of the request
	// entries). It may carry request values: only use it as a label under
	// a cardinality cap.
	MetricKey string
	// Release is true when the request descriptor is a concurrency lease
	// release: the entries of a node holding a concurrency limit followed
	// by one trailing entry whose key is ReleaseKey (value ignored), sent
	// by Envoy through a route rate_limit with apply_on_stream_done: true.
	Release bool
	// Override is true when Set.Override built Rule for a request limit
	// override; false for a config match, including the one Set.Override
	// returns when the override policy is deny.
	Override bool
	// id holds the counter identity values (request values, or the
	// wildcard pattern on share_threshold levels); used by Key.
	id []Entry
}

// KeyOptions shape backend keys.
type KeyOptions struct {
	// Prefix is prepended to every backend key (CACHE_KEY_PREFIX).
	Prefix string
	// ClearText keeps descriptor values readable in keys instead of
	// hashing them. Development only: credentials then sit in the store.
	ClearText bool
}

// LoadOptions control Load.
type LoadOptions struct {
	// MergeDomains lets several files contribute descriptors to one domain
	// (envoyproxy/ratelimit MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// IgnoreDotFiles skips files and directories whose name starts with a
	// dot (Kubernetes ConfigMap ..data and timestamped directories).
	IgnoreDotFiles bool
	// RepeatPaths loads a file as often as the paths name it (a path
	// given twice, or a file and a directory holding it), as
	// envoyproxy/ratelimit loads every file it is given: the repeat is
	// then a duplicate domain, or with MergeDomains a duplicate key.
	// False loads each file once.
	RepeatPaths bool
	// LiteralValues compares every descriptor value as a string, as
	// envoyproxy/ratelimit does: a value such as 10.0.0.0/8 matches only
	// the same string, not the addresses inside it. Reference mode sets it.
	LiteralValues bool
	// Keys shape the backend keys of the loaded Set ((*Set).Key); the
	// zero value hashes values and adds no prefix.
	Keys KeyOptions
	// MaxRules is the most rules (Set.Rules) a load may compile; a config
	// with more is refused (a *ConfigError with File "config" naming both
	// counts) and never returned, so the config in force stays. 0 means
	// no limit.
	MaxRules int
	// MaxBytes is the most bytes the config files of one load may hold
	// together, checked (by size, then by bytes read) before anything is
	// parsed; a larger config is refused like one with too many rules. 0
	// means no limit.
	MaxBytes int64
	// Algorithms, when not nil, are the only algorithms the backend
	// decides (a Store's service.AlgorithmLister): a limit of any other
	// algorithm is refused at its line, "algorithm sliding_window is not
	// supported by the <Backend> backend (supported: fixed_window)", so
	// such a config never loads and the config in force stays. nil allows
	// every algorithm.
	Algorithms []algo.Kind
	// Backend names the backend in that message ("memcache").
	Backend string
	// NoPenalty: the backend cannot decide a penalty box atomically (a
	// Store's service.PenaltyBoxer says so); a `penalty:` is refused at
	// its line, naming Backend, like an unsupported algorithm.
	NoPenalty bool
	// Durable says which limits may have `store: durable` (Spec.Store).
	// Its zero value refuses every one of them at its line: no durable
	// store is configured.
	Durable DurableOptions
}

// DurableOptions describe the durable store to the loader: a limit with
// `store: durable` is refused at its file:line when Enabled is false,
// when its window is shorter than MinDurableWindow, or when its
// algorithm is not in Algorithms. Algorithms does not restrict the
// other limits, and LoadOptions.Algorithms does not restrict durable
// ones.
type DurableOptions struct {
	// Enabled: a durable store is configured (ratelimitd --durable-url).
	Enabled bool
	// Algorithms, when not nil, are the only algorithms the durable store
	// decides (its service.AlgorithmLister); nil allows every algorithm.
	Algorithms []algo.Kind
}

// Warning is a lint finding that does not reject a load.
type Warning struct {
	// File is the config file the finding is about; "" for a finding
	// about the load as a whole.
	File string
	// Line is the 1-based line in File; 0 when the finding has no line.
	Line int
	// Message is the finding, without position or "warning:" prefix.
	Message string
}

// String returns "file:line: warning: message", or "warning: message" for a
// warning about the load as a whole (File "", e.g. no domains loaded).
func (w Warning) String() string {
	if w.File == "" {
		return "warning: " + w.Message
	}
	return formatPos(w.File, w.Line) + ": warning: " + w.Message
}
