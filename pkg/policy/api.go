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

const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Week
	Month // 30 days epoch-aligned, or a calendar month with calendar: true
	Year  // 365 days epoch-aligned, or a calendar year with calendar: true
)

// FailureMode is what a limit does when the backend cannot decide
// (contract: failure_mode). The zero value FailOpen allows.
type FailureMode uint8

const (
	FailOpen   FailureMode = iota // allow, counted as failed_open
	FailClosed                    // deny (temporary-reduced-capacity), counted as failed_closed
	FailLocal                     // decide with the in-process limiter
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
	Policy          string
	Unit            Unit
	RequestsPerUnit uint32
	UnitMultiplier  uint32 // >= 1
	Algorithm       algo.Kind
	Burst           int64 // token bucket capacity; 0 = RequestsPerUnit
	Calendar        bool
	FailureMode     FailureMode
	// Limit is the compiled algorithm input.
	Limit algo.Limit
	// Window is the quota window for RateLimit-Policy w= (unit × multiplier;
	// the calendar unit's nominal length when Calendar).
	Window time.Duration
}

// Rule is a descriptor node that answers a request descriptor: it carries
// `rate_limit`, `rate_limits` or `unlimited: true`. Rules are immutable.
type Rule struct {
	Domain string
	// Path is the node's stat key as envoyproxy/ratelimit builds it:
	// "domain.k1_v1.k2" (value omitted where the config node has none;
	// wildcard nodes show their pattern). Bounded by the config.
	Path string
	// Name is the first limit's rate_limit.name ("" when absent; for an
	// unlimited rule, its rate_limit.name). For `replaces` matching, the
	// names of all Specs count.
	Name           string
	Limits         []Spec // empty iff Unlimited
	Unlimited      bool
	Replaces       []string
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	// Counting is the descriptor's `counting:` (all_or_nothing or
	// always_charge); CountingDefault when absent (the global policy).
	Counting Counting
	// Metadata is the node's `metadata:` map (JSON-compatible values), nil
	// when absent.
	Metadata map[string]any
	// File and Line locate the node in the config.
	File string
	Line int

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
}

// Entry is one request descriptor entry (Envoy RateLimitDescriptor.Entry).
type Entry struct {
	Key   string
	Value string
}

// ReleaseKey is the key of the trailing entry that turns a descriptor into a
// concurrency lease release (see Match.Release).
const ReleaseKey = "ratelimitd.release"

// Match is a request descriptor resolved against a Set.
type Match struct {
	Rule *Rule
	// MetricKey is the stat key for this match (Rule.Path, or with
	// detailed_metric / value_to_metric the request-value form). It may
	// carry request values: only use it as a label under a cardinality cap.
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
	Keys           KeyOptions
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
}

// Warning is a lint finding that does not reject a load.
type Warning struct {
	File    string
	Line    int
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

// Load reads YAML files (a path may be a file or a directory, walked
// recursively, .yaml/.yml files only) and compiles them into a Set. Every
// problem is reported at once: the returned error joins errors that each
// start with "file:line: ". A non-nil error means no Set.
// func Load(opts LoadOptions, paths ...string) (*Set, []Warning, error)
//
// LoadSources is Load for documents held in memory (each Source one
// config file's content, named for errors): configs delivered over xDS
// (pkg/policy/xds) go through it, and so through the same validation.
// func LoadSources(opts LoadOptions, srcs ...Source) (*Set, []Warning, error)

// Set methods the service relies on (implemented in set.go and key.go;
// Load in load.go, Watch in watch.go; docs/config.md is the user reference):
//   (*Set).HasDomain(domain string) bool
//   (*Set).Match(domain string, entries []Entry) (Match, bool)
//     ok=false: no rule applies (unknown domain, no node, depth mismatch).
//   (*Set).Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) Match
//     a Match for a request-supplied RateLimitOverride (fixed window),
//     under the rule's or domain's override: policy (allow, deny,
//     lower_only, max); Rule nil when it applies no limit.
//   (*Set).Key(m Match, i int) string
//     backend key for m.Rule.Limits[i]; injective over (domain, rule path,
//     limit index and algorithm, identity entries), and for an override
//     over (domain, unit, requests_per_unit, entries); values hashed unless
//     KeyOptions.ClearText.
//   (*Set).Hash() string      hex digest of the compiled config (metrics)
//   (*Set).SourceHash() string  hex digest of the files' paths and bytes
//     Load read: equal for a reload that changes nothing (a no-op reload)
//   (*Set).Domains() []string
//   (*Set).Rules() []*Rule    every rule, in config order (for /rlconfig)
//   (*Set).WriteExplain(w io.Writer) error   human dump for /rlconfig and validate --explain

// Watch loads paths, then reloads whenever one of the config files changes
// (only the files Load would read, their symlink targets and the
// subdirectories it walks; Kubernetes ..data symlink swaps and
// write-then-rename editors included). It calls apply with each good Set,
// changed or not (compare Set.SourceHash), and fail with each load error,
// read error (IsReadError, retried) or watcher error (*WatchError); the
// previous Set stays in force. The first load's result is delivered before
// Watch blocks. Watch returns when ctx is done.
// func Watch(ctx context.Context, opts LoadOptions, paths []string, apply func(*Set, []Warning), fail func(error)) error
