package policy

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// level holds the compiled children of one tree level.
type level struct {
	exact map[entryKey]*node // key + exact value
	wild  map[string][]*node // key -> wildcard nodes in declaration order
	cidr  map[string]*prefixTable
	bare  map[string]*node // value-less key defaults
	// canon holds the keys with CIDR values or ipv6_prefix (their
	// values are addresses); exactAddr those of them with an exact
	// address value, stored in canonical form (canonAddrValue): a
	// request value that misses is looked up again in that form.
	canon, exactAddr map[string]bool
}

type entryKey struct{ k, v string }

// find resolves one request entry at this level: exact value, then the
// most specific CIDR prefix holding the value, then the first declared
// wildcard for the key, then the value-less default.
func (lv *level) find(e Entry) *node {
	if e.Value != "" {
		if n := lv.exact[entryKey{e.Key, e.Value}]; n != nil {
			return n
		}
		if lv.exactAddr[e.Key] {
			if c := canonAddrValue(e.Value); c != e.Value {
				if n := lv.exact[entryKey{e.Key, c}]; n != nil {
					return n
				}
			}
		}
		if t := lv.cidr[e.Key]; t != nil {
			if n := t.lookup(e.Value); n != nil {
				return n
			}
		}
	}
	for _, n := range lv.wild[e.Key] {
		if n.pat.match(e.Value) {
			return n
		}
	}
	return lv.bare[e.Key]
}

type domainTree struct {
	name string
	top  *level
	// override is the domain's top-level override: mapping (one file's;
	// nil when none sets it).
	override *overridePolicy
	// reserve: some rule of the domain has reserve (Match then looks
	// for a trailing priority entry).
	reserve bool
}

// underDotEntry reports whether a or b, below the directories the two
// paths share, passes through an entry whose name starts with a dot (a
// Kubernetes ConfigMap volume's ..data or ..<timestamp> directory, or a
// dot file): the duplicate that IgnoreDotFiles would not have loaded.
func underDotEntry(a, b string) bool {
	pa := strings.Split(filepath.ToSlash(filepath.Clean(a)), "/")
	pb := strings.Split(filepath.ToSlash(filepath.Clean(b)), "/")
	i := 0
	for i < len(pa)-1 && i < len(pb)-1 && pa[i] == pb[i] {
		i++
	}
	for _, rest := range [][]string{pa[i:], pb[i:]} {
		for _, name := range rest {
			if strings.HasPrefix(name, ".") && name != "." && name != ".." {
				return true
			}
		}
	}
	return false
}

// compile builds a Set from parsed files (already in load order).
func compile(files []*fileConfig, opts LoadOptions, errs *errList) *Set {
	type domainSrc struct {
		file     string
		line     int
		descs    []*node
		override *overridePolicy
	}
	var order []string
	byDomain := map[string]*domainSrc{}
	for _, fc := range files {
		if fc == nil || fc.domain == "" {
			continue
		}
		d := byDomain[fc.domain]
		if d == nil {
			byDomain[fc.domain] = &domainSrc{file: fc.file, line: fc.domainLine, descs: fc.descs, override: fc.override}
			order = append(order, fc.domain)
			continue
		}
		if !opts.MergeDomains {
			if !opts.IgnoreDotFiles && underDotEntry(fc.file, d.file) {
				errs.add(fc.file, fc.domainLine, "duplicate domain %q in config file (first defined at %s; one of them is below a dot file or directory, as in a Kubernetes ConfigMap mount's ..data: set the ignore-dotfiles option to skip those: --ignore-dotfiles, or RUNTIME_IGNOREDOTFILES=true with envoyproxy/ratelimit's variables)", fc.domain, formatPos(d.file, d.line))
				continue
			}
			errs.add(fc.file, fc.domainLine, "duplicate domain %q in config file (first defined at %s; set the merge-domains option to combine files)", fc.domain, formatPos(d.file, d.line))
			continue
		}
		d.descs = append(d.descs, fc.descs...)
		if fc.override != nil {
			if d.override != nil {
				errs.add(fc.file, fc.override.line, "override for domain %q is set in two files (first at %s); set it in one", fc.domain, formatPos(d.override.file, d.override.line))
				continue
			}
			d.override = fc.override
		}
	}
	s := &Set{keys: opts.Keys, domains: make(map[string]*domainTree, len(order)), algorithms: opts.Algorithms, backend: opts.Backend, durable: opts.Durable, noPenalty: opts.NoPenalty, literal: opts.LiteralValues}
	for _, name := range order {
		src := byDomain[name]
		dt := &domainTree{name: name, override: src.override}
		first := len(s.rules)
		dt.top = s.buildLevel(name, nil, src.descs, errs)
		for _, r := range s.rules[first:] {
			dt.reserve = dt.reserve || r.Reserve != nil
		}
		s.domains[name] = dt
		warnPolicyCollisions(s.rules[first:], errs)
	}
	s.names = sortedKeys(s.domains)
	return s
}

// buildLevel compiles sibling descriptors (path is the list of ancestors).
func (s *Set) buildLevel(domain string, path []*node, descs []*node, errs *errList) *level {
	if len(descs) == 0 {
		return nil
	}
	lv := &level{}
	type sib struct {
		key  string
		kind valueKind
		val  string
	}
	seen := make(map[sib]*node, len(descs))
	if !s.literal {
		// A key with CIDR values or ipv6_prefix holds addresses: its
		// exact address values match, and its entries are keyed, in
		// one canonical form, whatever the spelling.
		for _, n := range descs {
			if n.kind == valueCIDR || n.ipv6Prefix > 0 {
				if lv.canon == nil {
					lv.canon = map[string]bool{}
				}
				lv.canon[n.key] = true
			}
		}
	}
	for _, n := range descs {
		if n.key == "" {
			continue // reported at parse
		}
		n.canon = lv.canon[n.key] && n.kind != valuePattern
		val := n.value
		if n.canon && n.kind == valueExact {
			if _, ok := parseIPValue(val); ok {
				val = canonAddrValue(val)
				if lv.exactAddr == nil {
					lv.exactAddr = map[string]bool{}
				}
				lv.exactAddr[n.key] = true
			}
		}
		id := sib{n.key, n.kind, val}
		if n.kind == valueCIDR {
			if !n.prefix.IsValid() {
				continue // reported at parse
			}
			id.val = n.prefix.String()
		}
		if first, dup := seen[id]; dup {
			errs.add(n.file, n.line, "duplicate descriptor composite key '%s' (first at %s)", statPath(domain, path, n), formatPos(first.file, first.line))
			continue
		}
		seen[id] = n
		switch n.kind {
		case valueExact:
			if lv.exact == nil {
				lv.exact = map[entryKey]*node{}
			}
			lv.exact[entryKey{n.key, val}] = n
		case valuePattern:
			if lv.wild == nil {
				lv.wild = map[string][]*node{}
			}
			lv.wild[n.key] = append(lv.wild[n.key], n)
		case valueCIDR:
			if lv.cidr == nil {
				lv.cidr = map[string]*prefixTable{}
			}
			if lv.cidr[n.key] == nil {
				lv.cidr[n.key] = &prefixTable{}
			}
			lv.cidr[n.key].add(n)
		default:
			if lv.bare == nil {
				lv.bare = map[string]*node{}
			}
			lv.bare[n.key] = n
		}
		np := append(path[:len(path):len(path)], n)
		if len(n.limits) > 0 {
			s.buildRule(domain, np, errs)
		}
		n.level = s.buildLevel(domain, np, n.children, errs)
	}
	return lv
}

// statPath is the stat key of node n under path in domain, as
// envoyproxy/ratelimit builds it: "domain.seg1.seg2" with each node's
// segment ("key" or "key_value"); n nil leaves it out.
func statPath(domain string, path []*node, n *node) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, p := range path {
		b.WriteByte('.')
		b.WriteString(p.seg)
	}
	if n != nil {
		b.WriteByte('.')
		b.WriteString(n.seg)
	}
	return b.String()
}

// buildRule compiles the limits of the last node of path into a Rule.
func (s *Set) buildRule(domain string, path []*node, errs *errList) {
	n := path[len(path)-1]
	r := &Rule{
		Domain:         domain,
		Path:           statPath(domain, path[:len(path)-1], n),
		ShadowMode:     n.shadow,
		QuotaMode:      n.quota,
		DetailedMetric: n.detailed,
		Counting:       n.counting,
		Metadata:       n.metadata,
		File:           n.file,
		Line:           n.line,
		nodes:          path,
	}
	for _, p := range path {
		if p.share || p.valueToMetric {
			r.needsPath = true
		}
		if p.ipv6Prefix > 0 || p.canon {
			r.normalize = true
		}
	}
	r.CGNAT, r.Reserve = n.cgnat, n.reserve
	if n.penalty != nil {
		r.Penalty = n.penalty.p
		if s.noPenalty {
			errs.add(n.file, n.penalty.line, "descriptor %q: penalty is not supported by the %s backend (it cannot count denials and block in one atomic step); use the memory or redis backend", r.Path, s.backend)
		}
	}
	if n.detailed {
		r.needsPath = true
	}
	authHit := looksLikeAuth(path)
	names := map[string]bool{}
	for i, l := range n.limits {
		if i == 0 {
			r.Name = l.name
		}
		if l.name != "" {
			names[l.name] = true
		}
		r.Replaces = append(r.Replaces, l.replaces...)
		if l.unlimited {
			r.Unlimited = true
			continue
		}
		sp := Spec{
			Name:            l.name,
			Unit:            l.unit,
			RequestsPerUnit: uint32(l.rpu),
			UnitMultiplier:  uint32(l.mult),
			Algorithm:       l.algorithm,
			Burst:           l.burst,
			Calendar:        l.calendar,
			FailureMode:     l.failure,
			Store:           l.store,
			Consistency:     l.consistency,
		}
		if l.algorithm == algo.FixedWindow || l.algorithm == algo.SlidingWindow {
			sp.EarlyWarning = l.earlyWarning
		}
		sp.Limit = compileLimit(&l)
		sp.Window = sp.Limit.Period
		switch {
		case l.name != "":
			sp.Policy = sfSafe(l.name)
		case i == 0:
			sp.Policy = sfSafe(r.Path)
		default:
			sp.Policy = sfSafe(r.Path) + "#" + strconv.Itoa(i+1)
		}
		if l.store == StoreDurable {
			s.checkDurable(errs, n.file, r.Path, &l, &sp)
		} else if !s.supports(l.algorithm) {
			line := l.algorithmLine
			if line == 0 {
				line = l.line
			}
			errs.add(n.file, line, "descriptor %q: algorithm %s is not supported by the %s backend (supported: %s); use one of those or another backend", r.Path, AlgorithmName(l.algorithm), s.backend, s.supportedNames())
		}
		if authHit != "" && l.algorithm == algo.FixedWindow {
			errs.warn(n.file, l.line, "fixed_window limit on descriptor %q, which looks like authentication (%q): a fixed window lets a client make up to twice the limit around a window boundary; use algorithm sliding_log (exact) or sliding_window", r.Path, authHit)
		}
		r.Limits = append(r.Limits, sp)
		r.keyPre = append(r.keyPre, rulePrefix(domain, path, i, &sp))
	}
	if n.penalty != nil {
		switch {
		case r.Unlimited:
			errs.add(n.file, n.penalty.line, "descriptor %q: penalty does nothing on an unlimited rule (it never denies a hit, so nothing starts a block); remove penalty or give the rule a limit", r.Path)
		case slices.ContainsFunc(r.Limits, func(sp Spec) bool { return sp.Store == StoreDurable }):
			errs.add(n.file, n.penalty.line, "descriptor %q: penalty is not available with store: durable (the durable store has no penalty box); remove penalty or keep the limit on the fast store", r.Path)
		case slices.ContainsFunc(r.Limits, func(sp Spec) bool { return sp.Consistency == Leased }):
			// A leased hit is decided from the instance's lease, without
			// the store call that counts denials and blocks atomically.
			errs.add(n.file, n.penalty.line, "descriptor %q: penalty is not available with consistency: leased (a leased hit is decided from a local lease, which cannot count denials toward a block); remove penalty or use consistency: exact", r.Path)
		}
	}
	for i, l := range n.limits {
		for j, rep := range l.replaces {
			if names[rep] && rep != l.name {
				errs.add(n.file, l.replacesLines[j], "replaces: rate limit %q cannot replace a limit of its own descriptor", rep)
			}
		}
		_ = i
	}
	s.buildVariants(r, n, errs)
	n.rule = r
	s.rules = append(s.rules, r)
}

// sfSafe makes s a valid RFC 9651 sf-string body: printable ASCII
// (0x20-0x7E) is kept; other bytes become %XX (uppercase hex); '%' itself
// is kept, so the mapping is readable but not guaranteed reversible.
// Serializers still escape '"' and '\' as RFC 9651 section 4.1.6 requires.
func sfSafe(s string) string {
	ok := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// checkDurable reports, at the `store:` line of limit l (compiled: sp) of
// the rule at path, why the durable store cannot decide it: none is
// configured, its window is shorter than MinDurableWindow, or its
// algorithm is not one the durable store decides.
func (s *Set) checkDurable(errs *errList, file, path string, l *rawLimit, sp *Spec) {
	d := s.durable
	if !d.Enabled {
		errs.add(file, l.storeLine, "descriptor %q: store: durable needs a durable store, and none is configured (ratelimitd --durable-url)", path)
		return
	}
	if sp.Limit.Period < MinDurableWindow {
		errs.add(file, l.storeLine, "descriptor %q: store: durable needs a window of an hour or longer (window is %s); keep shorter limits on the fast store", path, sp.Limit.Period)
	}
	if d.Algorithms == nil || slices.Contains(d.Algorithms, l.algorithm) {
		return
	}
	names := make([]string, len(d.Algorithms))
	for i, a := range d.Algorithms {
		names[i] = AlgorithmName(a)
	}
	errs.add(file, l.storeLine, "descriptor %q: algorithm %s is not supported by the durable store (supported: %s)", path, AlgorithmName(l.algorithm), strings.Join(names, ", "))
}

// supports reports whether the backend decides algorithm k
// (LoadOptions.Algorithms; nil: every algorithm).
func (s *Set) supports(k algo.Kind) bool {
	if s.algorithms == nil {
		return true
	}
	for _, a := range s.algorithms {
		if a == k {
			return true
		}
	}
	return false
}

// supportedNames lists LoadOptions.Algorithms by config name, comma-separated.
func (s *Set) supportedNames() string {
	names := make([]string, len(s.algorithms))
	for i, a := range s.algorithms {
		names[i] = AlgorithmName(a)
	}
	return strings.Join(names, ", ")
}
