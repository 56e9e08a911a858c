package policy

import (
	"bytes"
	"errors"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// fileConfig is one parsed config file.
type fileConfig struct {
	file       string
	domain     string
	domainLine int
	descs      []*node
	override   *overridePolicy // top-level override:, nil when absent
}

// valueKind says how a descriptor node matches a request value.
type valueKind uint8

const (
	valueNone    valueKind = iota // no value: the key's default
	valueExact                    // value without '*'
	valuePattern                  // value with one or more '*'
)

// node is one descriptor of the config tree.
type node struct {
	key     string
	value   string
	kind    valueKind
	pat     pattern
	line    int
	keyLine int
	file    string

	rule     *Rule // nil: no limit here (placeholder or whitelist)
	children []*node
	level    *level // compiled children

	share         bool // share_threshold
	valueToMetric bool
	detailed      bool
	shadow        bool
	quota         bool
	counting      Counting // counting:, CountingDefault when absent
	metadata      map[string]any
	limits        []rawLimit      // parsed rate_limit / rate_limits items
	override      *overridePolicy // override:, nil when absent
	// seg is the node's stat key segment: "key" or "key_value".
	seg string
}

// parser turns one file's YAML into a fileConfig, reporting to errs.
type parser struct {
	file string
	errs *errList
	// budget bounds the nodes visited, so YAML aliases cannot expand a
	// small file into an exponential tree ("billion laughs").
	budget int
	over   bool
	// merging holds the mappings whose merge keys are being expanded, to
	// report a merge cycle (`a: &x {<<: *x}` parses) instead of looping.
	merging map[*yaml.Node]bool
}

// maxNodes bounds the descriptors, limits and metadata values of one file
// after alias expansion.
const maxNodes = 200000

// spend takes one node from the budget; false (reported once) when the
// file expands to more than maxNodes.
func (p *parser) spend(n *yaml.Node) bool {
	p.budget++
	if p.budget <= maxNodes {
		return true
	}
	if !p.over {
		p.over = true
		p.errs.add(p.file, n.Line, "config too large: more than %d descriptors, limits and metadata values after expanding YAML aliases", maxNodes)
	}
	return false
}

var yamlLineRE = regexp.MustCompile(`line (\d+)`)

func parseFile(file string, data []byte, errs *errList) *fileConfig {
	p := &parser{file: file, errs: errs}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			errs.add(file, 1, "empty config file: domain is required")
			return nil
		}
		p.yamlError(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		errs.add(file, extra.Line, "a config file holds one YAML document; found a second one")
		return nil
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
		return nil
	}
	root := deref(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = deref(root.Content[0])
	}
	if isNull(root) {
		errs.add(file, root.Line, "empty config file: domain is required")
		return nil
	}
	if root.Kind != yaml.MappingNode {
		errs.add(file, root.Line, "config file must be a mapping with domain and descriptors, got %s", kindName(root))
		return nil
	}
	fc := &fileConfig{file: file}
	seenDomain := false
	p.mapping(root, func(k string, kn, v *yaml.Node) {
		switch k {
		case "domain":
			seenDomain = true
			fc.domainLine = kn.Line
			if s, ok := p.str(v, "domain"); ok {
				fc.domain = s
			}
			if fc.domain == "" {
				p.errs.add(file, kn.Line, "config file cannot have empty domain")
			}
		case "descriptors":
			fc.descs = append(fc.descs, p.descriptors(v, nil)...)
		case "plans": // plan tiers × route classes, expanded in plans.go
			fc.descs = append(fc.descs, p.descriptors(p.plans(v), nil)...)
		case "override": // request limit overrides of the domain (override.go)
			fc.override = p.overrideField(kn, v, true)
		default:
			p.unknown(kn, k, "top level", topHints, topKeys)
		}
	})
	if !seenDomain {
		p.errs.add(file, root.Line, "config file cannot have empty domain: domain is required")
	}
	return fc
}

func (p *parser) yamlError(err error) {
	line := 0
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = yamlLineRE.ReplaceAllString(msg, "")
	msg = strings.TrimPrefix(msg, ": ")
	p.errs.add(p.file, line, "YAML syntax error: %s", msg)
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// listKindName is kindName, saying "an empty list" for an empty sequence.
func listKindName(n *yaml.Node) string {
	if n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
		return "an empty list"
	}
	return kindName(n)
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return strings.TrimPrefix(n.Tag, "!!") + " " + strconv.Quote(n.Value)
	}
	return "an unsupported YAML node"
}

// mapping calls f for each key of a mapping node in order, reporting
// non-string and duplicate keys. YAML merge keys (`<<: *alias` or
// `<<: [*a, *b]`, tag !!merge) are expanded as yaml.v2 (and so
// envoyproxy/ratelimit) resolves them: see pairs.
func (p *parser) mapping(m *yaml.Node, f func(k string, kn, v *yaml.Node)) {
	kv := p.pairs(m)
	seen := make(map[string]int, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		kn, v := kv[i], kv[i+1]
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" {
			p.errs.add(p.file, kn.Line, "key is not of type string: %s", kindName(kn))
			continue
		}
		if first, dup := seen[kn.Value]; dup {
			p.errs.add(p.file, kn.Line, "duplicate key %q (first at line %d)", kn.Value, first)
			continue
		}
		seen[kn.Value] = kn.Line
		f(kn.Value, kn, v)
	}
}

// isMergeKey reports whether a mapping key is the YAML merge key: a plain
// `<<` (yaml.v3 tags it !!merge; a quoted "<<" is an ordinary string key).
func isMergeKey(kn *yaml.Node) bool {
	return kn.Kind == yaml.ScalarNode && kn.Tag == "!!merge"
}

// maxMergeDepth bounds nested merge keys (a merged mapping that itself
// merges), well above any hand-written config.
const maxMergeDepth = 32

// pairs returns the key and value nodes (dereferenced, alternating) of a
// mapping with merge keys expanded, following the YAML merge key type
// (yaml.org/type/merge.html) as yaml.v2 implements it: the value of `<<` is
// a mapping (or alias of one) or a list of them; an explicit key of the
// mapping overrides a merged one wherever the `<<` stands, and an earlier
// mapping of a merge list wins over a later one. Merged pairs are placed
// where the `<<` stands and keep their own nodes, so errors point at the
// line of the anchored mapping. Explicit duplicates are kept (mapping
// reports them); merged keys never count as duplicates. A merge value that
// is not a mapping, or a merge cycle, is reported.
func (p *parser) pairs(m *yaml.Node) []*yaml.Node {
	return p.pairsDepth(m, 0)
}

func (p *parser) pairsDepth(m *yaml.Node, depth int) []*yaml.Node {
	hasMerge := false
	for i := 0; i+1 < len(m.Content); i += 2 {
		if isMergeKey(deref(m.Content[i])) {
			hasMerge = true
			break
		}
	}
	if !hasMerge {
		out := make([]*yaml.Node, 0, len(m.Content))
		for _, n := range m.Content {
			out = append(out, deref(n))
		}
		return out
	}
	if p.merging == nil {
		p.merging = map[*yaml.Node]bool{}
	}
	p.merging[m] = true
	defer delete(p.merging, m)
	explicit := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if kn := deref(m.Content[i]); !isMergeKey(kn) && kn.Kind == yaml.ScalarNode {
			explicit[kn.Value] = true
		}
	}
	merged := map[string]bool{}
	var out []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := deref(m.Content[i]), deref(m.Content[i+1])
		if !isMergeKey(kn) {
			out = append(out, kn, v)
			continue
		}
		var srcs []*yaml.Node
		switch v.Kind {
		case yaml.MappingNode:
			srcs = []*yaml.Node{v}
		case yaml.SequenceNode:
			for _, it := range v.Content {
				if it = deref(it); it.Kind != yaml.MappingNode {
					p.errs.add(p.file, it.Line, "merge key << (line %d): list item must be a mapping or an alias of one, got %s", kn.Line, kindName(it))
					continue
				}
				srcs = append(srcs, it)
			}
		default:
			p.errs.add(p.file, v.Line, "merge key << must be a mapping, an alias of one or a list of them, got %s", kindName(v))
			continue
		}
		for _, src := range srcs {
			if p.merging[src] || depth >= maxMergeDepth {
				p.errs.add(p.file, kn.Line, "merge key << refers to a mapping that contains itself (or nests merges deeper than %d)", maxMergeDepth)
				continue
			}
			if !p.spend(src) {
				return out
			}
			sub := p.pairsDepth(src, depth+1)
			for j := 0; j+1 < len(sub); j += 2 {
				skn := sub[j]
				if skn.Kind == yaml.ScalarNode {
					if explicit[skn.Value] || merged[skn.Value] {
						continue
					}
					merged[skn.Value] = true
				}
				out = append(out, skn, sub[j+1])
			}
		}
	}
	return out
}

// flat returns a mapping node equal to m with its merge keys expanded (m
// itself when it has none), for code that inspects keys directly (plans).
func (p *parser) flat(m *yaml.Node) *yaml.Node {
	m = deref(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return m
	}
	kv := p.pairs(m)
	same := len(kv) == len(m.Content)
	for i := range kv {
		if same && kv[i] != m.Content[i] {
			same = false
		}
	}
	if same {
		return m
	}
	c := *m
	c.Content = kv
	return &c
}

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
		"calendar": "(belongs in rate_limit)", "requestsperunit": "(did you mean requests_per_unit inside rate_limit?)",
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
	descKeys     = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "override", "counting"}
	limitKeys    = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "unit_multiplier", "failure_mode", "calendar"}
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

// str decodes a scalar as a string (ints and bools keep their YAML text, as
// envoyproxy/ratelimit's decoder does). Null gives "", true.
func (p *parser) str(v *yaml.Node, field string) (string, bool) {
	if isNull(v) {
		return "", true
	}
	if v.Kind != yaml.ScalarNode {
		p.errs.add(p.file, v.Line, "%s must be a string, got %s", field, kindName(v))
		return "", false
	}
	return v.Value, true
}

func (p *parser) boolean(v *yaml.Node, field string) bool {
	var b bool
	if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
		p.errs.add(p.file, v.Line, "%s must be true or false, got %s", field, kindName(v))
		return false
	}
	return b
}

// integer decodes a non-negative integer no larger than max.
func (p *parser) integer(v *yaml.Node, field string, min, max int64) (int64, bool) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		p.errs.add(p.file, v.Line, "%s must be an integer, got %s", field, kindName(v))
		return 0, false
	}
	var i int64
	if err := v.Decode(&i); err != nil {
		p.errs.add(p.file, v.Line, "%s: %q is out of range (maximum %d)", field, v.Value, max)
		return 0, false
	}
	if i < min {
		if i < 0 {
			p.errs.add(p.file, v.Line, "%s must not be negative, got %d", field, i)
		} else {
			p.errs.add(p.file, v.Line, "%s must be at least %d, got %d", field, min, i)
		}
		return 0, false
	}
	if i > max {
		p.errs.add(p.file, v.Line, "%s: %d is out of range (maximum %d)", field, i, max)
		return 0, false
	}
	return i, true
}

// descriptors parses a list of descriptor mappings. parent is nil at the
// top level.
func (p *parser) descriptors(v *yaml.Node, parent *node) []*node {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		p.errs.add(p.file, v.Line, "descriptors must be a list of mappings, got %s", kindName(v))
		return nil
	}
	var out []*node
	for _, it := range v.Content {
		it = deref(it)
		if it.Kind != yaml.MappingNode {
			p.errs.add(p.file, it.Line, "descriptors: list of type other than map: item is %s", kindName(it))
			continue
		}
		if n := p.descriptor(it); n != nil {
			out = append(out, n)
		}
	}
	return out
}

// rawLimit is a parsed rate_limit object before compilation.
type rawLimit struct {
	line            int
	unit            Unit
	unitSet         bool
	rpu             int64
	unlimited       bool
	name            string
	replaces        []string
	replacesLines   []int
	algorithm       algo.Kind
	algoSet         bool
	burst           int64
	mult            int64
	failure         FailureMode
	calendar        bool
	ok              bool
	nameLine        int
	calendarLine    int
	burstLine       int
	rpuLine         int
	multLine        int
	algorithmLine   int
	unlimitedLine   int
	extensionFields []string
}

func (p *parser) descriptor(m *yaml.Node) *node {
	if !p.spend(m) {
		return nil
	}
	n := &node{line: m.Line, file: p.file}
	var hasKey bool
	var limits []rawLimit
	var rlLine, rlsLine int
	var shareLine, overrideLine, countingLine int
	var meta *yaml.Node
	p.mapping(m, func(k string, kn, v *yaml.Node) {
		switch k {
		case "key":
			hasKey = true
			n.keyLine = kn.Line
			n.key, _ = p.str(v, "key")
			switch n.key {
			case "":
				p.errs.add(p.file, kn.Line, "descriptor has empty key")
			case ReleaseKey:
				p.errs.add(p.file, v.Line, "descriptor key %q is reserved for concurrency lease releases", ReleaseKey)
			}
		case "value":
			n.value, _ = p.str(v, "value")
		case "rate_limit":
			rlLine = kn.Line
			if isNull(v) {
				p.errs.add(p.file, v.Line, "rate_limit must be a mapping, got null")
				return
			}
			if l, ok := p.limit(v, kn.Line, "rate_limit"); ok {
				limits = append(limits, l)
			}
		case "rate_limits":
			rlsLine = kn.Line
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				p.errs.add(p.file, v.Line, "rate_limits must be a non-empty list of rate_limit mappings, got %s", listKindName(v))
				return
			}
			for i, it := range v.Content {
				it = deref(it)
				l, ok := p.limit(it, it.Line, "rate_limits["+strconv.Itoa(i)+"]")
				if !ok {
					continue
				}
				if l.unlimited {
					p.errs.add(p.file, l.unlimitedLine, "unlimited is only allowed in rate_limit, not in rate_limits")
					continue
				}
				limits = append(limits, l)
			}
		case "descriptors":
			n.children = p.descriptors(v, n)
		case "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold":
			b := p.boolean(v, k)
			switch k {
			case "shadow_mode":
				n.shadow = b
			case "quota_mode":
				n.quota = b
			case "detailed_metric":
				n.detailed = b
			case "value_to_metric":
				n.valueToMetric = b
			case "share_threshold":
				n.share = b
				shareLine = kn.Line
			}
		case "metadata":
			meta = v
		case "override":
			overrideLine = kn.Line
			n.override = p.overrideField(kn, v, false)
		case "counting":
			countingLine = kn.Line
			s, ok := p.str(v, "counting")
			if !ok {
				return
			}
			c, err := ParseCounting(s)
			if err != nil {
				p.errs.add(p.file, v.Line, "invalid counting %q: want all_or_nothing or always_charge", s)
				return
			}
			n.counting = c
		default:
			p.unknown(kn, k, "descriptor", descHints, descKeys)
		}
	})
	if !hasKey {
		p.errs.add(p.file, m.Line, "descriptor has empty key: key is required")
	}
	names := map[string]int{}
	for _, l := range limits {
		if l.name == "" {
			continue
		}
		if first, dup := names[l.name]; dup {
			p.errs.add(p.file, l.nameLine, "rate_limits: two limits named %q on one descriptor (first at line %d): RateLimit-Policy could not tell them apart", l.name, first)
			continue
		}
		names[l.name] = l.nameLine
	}
	if countingLine != 0 && rlLine == 0 && rlsLine == 0 {
		p.errs.add(p.file, countingLine, "counting applies to the limits of its descriptor, which has no rate_limit or rate_limits")
	}
	if overrideLine != 0 && rlLine == 0 && rlsLine == 0 {
		p.errs.add(p.file, overrideLine, "override applies to the rule of its descriptor, which has no rate_limit or rate_limits (set it at the top level of the file for the whole domain)")
	}
	if rlLine != 0 && rlsLine != 0 {
		p.errs.add(p.file, rlsLine, "rate_limit (line %d) and rate_limits on the same descriptor; use rate_limits only", rlLine)
	}
	switch {
	case n.value == "":
		n.kind = valueNone
		n.seg = n.key
	case strings.Contains(n.value, "*"):
		n.kind = valuePattern
		n.pat = compilePattern(n.value)
		n.seg = n.key + "_" + n.value
	default:
		n.kind = valueExact
		n.seg = n.key + "_" + n.value
	}
	if n.share && n.kind != valuePattern {
		p.errs.add(p.file, shareLine, "share_threshold requires a value with a '*' wildcard (value is %q)", n.value)
	}
	if meta != nil {
		md := p.metadata(meta)
		if mm, ok := md.(map[string]any); ok {
			n.metadata = mm
		} else if md != nil || !isNull(meta) {
			p.errs.add(p.file, meta.Line, "metadata must be a mapping, got %s", kindName(meta))
		}
	}
	n.limits = limits
	return n
}

// limit parses one rate_limit object; line is where it starts (the
// `rate_limit:` key, or the rate_limits item).
func (p *parser) limit(v *yaml.Node, line int, where string) (rawLimit, bool) {
	l := rawLimit{line: line, mult: 1, ok: true}
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "%s must be a mapping, got %s", where, kindName(v))
		return l, false
	}
	before := len(p.errs.errs)
	var unitLine int
	var unitText string
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "unit":
			unitLine = kn.Line
			l.unitSet = true
			unitText, _ = p.str(v, "unit")
		case "requests_per_unit":
			l.rpuLine = kn.Line
			l.rpu, _ = p.integer(v, "requests_per_unit", 0, MaxRequestsPerUnit)
		case "unlimited":
			l.unlimitedLine = kn.Line
			l.unlimited = p.boolean(v, "unlimited")
		case "name":
			l.nameLine = kn.Line
			l.name, _ = p.str(v, "name")
		case "replaces":
			if isNull(v) {
				return
			}
			if v.Kind != yaml.SequenceNode {
				p.errs.add(p.file, v.Line, "replaces must be a list of {name: ...} mappings, got %s", kindName(v))
				return
			}
			for _, it := range v.Content {
				it = deref(it)
				if it.Kind != yaml.MappingNode {
					p.errs.add(p.file, it.Line, "replaces: list of type other than map: item is %s", kindName(it))
					continue
				}
				name, line := "", it.Line
				p.mapping(it, func(k string, kn, v *yaml.Node) {
					if k != "name" {
						p.unknown(kn, k, "replaces item", nil, replacesKeys)
						return
					}
					line = kn.Line
					name, _ = p.str(v, "replaces name")
				})
				if name == "" {
					p.errs.add(p.file, line, "replaces: name must not be empty")
					continue
				}
				l.replaces = append(l.replaces, name)
				l.replacesLines = append(l.replacesLines, line)
			}
		case "algorithm":
			l.algorithmLine = kn.Line
			s, _ := p.str(v, "algorithm")
			a, ok := parseAlgorithm(s)
			if !ok {
				p.errs.add(p.file, v.Line, "invalid algorithm %q: want fixed_window, sliding_window, sliding_log, token_bucket or concurrency", s)
				break
			}
			l.algorithm, l.algoSet = a, true
			l.extensionFields = append(l.extensionFields, k)
		case "burst":
			l.burstLine = kn.Line
			l.burst, _ = p.integer(v, "burst", 1, MaxRequestsPerUnit)
			l.extensionFields = append(l.extensionFields, k)
		case "unit_multiplier":
			l.multLine = kn.Line
			if m, ok := p.integer(v, "unit_multiplier", 1, math.MaxUint32); ok {
				l.mult = m
			}
			l.extensionFields = append(l.extensionFields, k)
		case "failure_mode":
			s, _ := p.str(v, "failure_mode")
			f, ok := parseFailureMode(s)
			if !ok {
				p.errs.add(p.file, v.Line, "invalid failure_mode %q: want open, closed or local", s)
				break
			}
			l.failure = f
			l.extensionFields = append(l.extensionFields, k)
		case "calendar":
			l.calendarLine = kn.Line
			l.calendar = p.boolean(v, "calendar")
			l.extensionFields = append(l.extensionFields, k)
		default:
			p.unknown(kn, k, "rate_limit", limitHints, limitKeys)
		}
	})
	if l.unlimited {
		if l.unitSet && unitText != "" {
			if _, ok := ParseUnit(unitText); ok {
				p.errs.add(p.file, unitLine, "should not specify rate limit unit when unlimited")
			} else {
				p.errs.add(p.file, unitLine, "invalid rate limit unit %q", unitText)
			}
		}
		if len(l.extensionFields) > 0 {
			p.errs.add(p.file, l.unlimitedLine, "unlimited rate_limit must not set %s", strings.Join(l.extensionFields, ", "))
		}
	} else {
		u, ok := ParseUnit(unitText)
		switch {
		case !l.unitSet || unitText == "":
			p.errs.add(p.file, l.line, "invalid rate limit unit '': unit is required (second, minute, hour, day, week, month or year) unless unlimited: true")
		case !ok:
			p.errs.add(p.file, unitLine, "invalid rate limit unit %q: want second, minute, hour, day, week, month or year", unitText)
		default:
			l.unit = u
		}
	}
	if !l.unlimited && l.unit.Valid() {
		p.checkLimit(&l)
	}
	if l.name != "" {
		for i, r := range l.replaces {
			if r == l.name {
				p.errs.add(p.file, l.replacesLines[i], "replaces: rate limit %q cannot replace itself", r)
			}
		}
	}
	l.ok = len(p.errs.errs) == before
	return l, l.ok
}

// metadata converts a YAML node to JSON-compatible values: map[string]any,
// []any, string, bool, int64, float64, nil.
func (p *parser) metadata(v *yaml.Node) any {
	v = deref(v)
	if !p.spend(v) {
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(v.Content)/2)
		p.mapping(v, func(k string, _, val *yaml.Node) { m[k] = p.metadata(val) })
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(v.Content))
		for _, it := range v.Content {
			s = append(s, p.metadata(it))
		}
		return s
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!null":
			return nil
		case "!!bool":
			var b bool
			if v.Decode(&b) == nil {
				return b
			}
		case "!!int":
			var i int64
			if v.Decode(&i) == nil {
				return i
			}
			var f float64
			if v.Decode(&f) == nil {
				return f
			}
		case "!!float":
			var f float64
			if v.Decode(&f) == nil {
				return f
			}
		}
		return v.Value
	}
	return nil
}

// checkLimit validates the extension fields of a limit with a valid unit,
// then the compiled algo.Limit against algo's bounds.
func (p *parser) checkLimit(l *rawLimit) {
	before := len(p.errs.errs)
	at := func(line int) int {
		if line == 0 {
			return l.line
		}
		return line
	}
	unit := strings.ToLower(l.unit.String())
	if l.burst != 0 && l.algorithm != algo.TokenBucket {
		p.errs.add(p.file, l.burstLine, "burst applies to algorithm token_bucket only (algorithm is %s)", AlgorithmName(l.algorithm))
	}
	if l.algorithm == algo.SlidingLog && l.rpu > MaxSlidingLogRate {
		p.errs.add(p.file, at(l.rpuLine), "sliding_log keeps one entry per admitted request: requests_per_unit %d is above its bound %d; use algorithm sliding_window for large limits", l.rpu, MaxSlidingLogRate)
	}
	if l.algorithm == algo.Concurrency && l.rpu > algo.MaxConcurrencyRate {
		p.errs.add(p.file, at(l.rpuLine), "concurrency keeps one entry per lease: requests_per_unit %d is above its bound %d", l.rpu, algo.MaxConcurrencyRate)
	}
	if l.calendar {
		if l.unit != Month && l.unit != Year {
			p.errs.add(p.file, l.calendarLine, "calendar: true applies to units month and year only (unit is %s)", unit)
		}
		if l.algorithm != algo.FixedWindow && l.algorithm != algo.SlidingWindow {
			p.errs.add(p.file, l.calendarLine, "calendar: true applies to fixed_window and sliding_window only (algorithm is %s)", AlgorithmName(l.algorithm))
		}
	}
	if float64(l.unit.Duration())*float64(l.mult) > float64(MaxWindow) {
		p.errs.add(p.file, at(l.multLine), "window %s × %d is longer than the maximum of %d days", unit, l.mult, MaxWindow/(24*time.Hour))
	}
	if len(p.errs.errs) > before {
		return
	}
	if err := compileLimit(l).Validate(); err != nil {
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), algo.ErrInvalidLimit.Error()), ": ")
		p.errs.add(p.file, l.line, "rate limit out of bounds: %s", msg)
	}
}

// compileLimit is the algo.Limit of a validated rawLimit with a valid unit.
func compileLimit(l *rawLimit) algo.Limit {
	lim := algo.Limit{
		Kind:       l.algorithm,
		Rate:       l.rpu,
		Period:     l.unit.Duration() * time.Duration(l.mult),
		Burst:      l.burst,
		Multiplier: l.mult,
	}
	if l.calendar {
		lim.Calendar = algo.CalendarMonth
		if l.unit == Year {
			lim.Calendar = algo.CalendarYear
		}
	}
	return lim
}
