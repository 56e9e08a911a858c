package policy

import (
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var (
	topHints = map[string]string{
		"descriptor": "descriptors", "descriptor_list": "descriptors", "domains": "domain",
		"key": "(belongs in a descriptor under descriptors)", "rate_limit": "(belongs in a descriptor under descriptors)",
	}
	descHints = map[string]string{
		"ratelimit": "rate_limit", "ratelimits": "rate_limits", "ratelimit_": "rate_limit", "limit": "rate_limit",
		"descriptor": "descriptors", "shadowmode": "shadow_mode", "quotamode": "quota_mode",
		"detailedmetric": "detailed_metric", "sharethreshold": "share_threshold", "valuetometric": "value_to_metric",
		"unit": "(belongs in rate_limit)", "requests_per_unit": "(belongs in rate_limit)", "unlimited": "(belongs in rate_limit)",
		"name": "(belongs in rate_limit)", "replaces": "(belongs in rate_limit)", "algorithm": "(belongs in rate_limit)",
		"burst": "(belongs in rate_limit)", "unit_multiplier": "(belongs in rate_limit)", "failure_mode": "(belongs in rate_limit)",
		"calendar": "(belongs in rate_limit)", "store": "(belongs in rate_limit)", "requestsperunit": "(did you mean requests_per_unit inside rate_limit?)",
		"domain": "(belongs at the top level of the file)",
	}
	limitHints = map[string]string{
		"requestsperunit": "requests_per_unit", "requests_per_second": "requests_per_unit", "rpu": "requests_per_unit",
		"units": "unit", "unitmultiplier": "unit_multiplier", "multiplier": "unit_multiplier", "algo": "algorithm",
		"failuremode": "failure_mode", "replace": "replaces", "shadow_mode": "(belongs in the descriptor, next to rate_limit)",
		"quota_mode": "(belongs in the descriptor, next to rate_limit)", "key": "(belongs in the descriptor)",
		"value": "(belongs in the descriptor)", "descriptors": "(belongs in the descriptor)",
		"metadata": "(belongs in the descriptor)", "detailed_metric": "(belongs in the descriptor)",
		"counting": "(belongs in the descriptor, next to rate_limit)",
	}
)

// Keys valid at each level, for edit-distance suggestions.
var (
	topKeys      = []string{"domain", "descriptors", "plans", "override"}
	descKeys     = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "override", "counting", "ipv6_prefix", "cgnat", "reserve", "penalty"}
	cgnatKeys    = []string{"multiplier", "ranges"}
	reserveKeys  = []string{"entry", "value", "share", "saturated_share"}
	limitKeys    = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "unit_multiplier", "failure_mode", "calendar", "early_warning", "store", "consistency"}
	plansKeys    = []string{"plan_key", "credential_key", "route_key", "tiers", "routes", "exempt", "anonymous"}
	replacesKeys = []string{"name"}
	routeKeys    = []string{"rate_limit", "tiers"}
	exemptKeys   = []string{"credential", "reason"}
)

// unknown reports an unknown key k at a level (where), with a suggestion:
// the hint table first (hints, keyed by lower-case key), else the closest
// key of valid by optimal-string-alignment distance (Damerau-Levenshtein
// without repeated edits of one substring), case-insensitive, when that
// distance is at most 1 for keys of up to 4 bytes and at most 2 otherwise.
func (p *parser) unknown(kn *yaml.Node, k, where string, hints map[string]string, valid []string) {
	msg := "unknown key " + strconv.Quote(k) + " in " + where
	if h, ok := hints[strings.ToLower(k)]; ok {
		if strings.HasPrefix(h, "(") {
			msg += " " + h
		} else {
			msg += "; did you mean " + strconv.Quote(h) + "?"
		}
	} else if s := suggest(k, valid); s != "" {
		msg += "; did you mean " + strconv.Quote(s) + "?"
	}
	p.errs.add(p.file, kn.Line, "%s", msg)
}

// suggest returns the key of valid closest to k (see unknown), or "".
func suggest(k string, valid []string) string {
	limit := 2
	if len(k) <= 4 {
		limit = 1
	}
	best, bestD := "", limit+1
	lk := strings.ToLower(k)
	for _, v := range valid {
		if d := osaDistance(lk, v); d < bestD {
			best, bestD = v, d
		}
	}
	return best
}

// osaDistance is the optimal string alignment distance between a and b
// (bytes): insertions, deletions, substitutions and transpositions of two
// adjacent bytes, each costing 1.
func osaDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt32 // no suggestion for long keys; bounds the work
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := 0; j <= len(b); j++ {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
