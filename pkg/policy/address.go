package policy

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Address options of a descriptor: CIDR values (a node whose value is a
// prefix matches request values inside it), ipv6_prefix (request
// addresses are keyed by their prefix) and cgnat (addresses in carrier-
// grade NAT ranges get a raised limit).

// DefaultIPv6Prefix is the ipv6_prefix used when the option is set
// without a number (`ipv6_prefix: true` or `ipv6_prefix:`).
const DefaultIPv6Prefix = 64

// DefaultCGNATMultiplier is the cgnat multiplier when none is given.
const DefaultCGNATMultiplier = 10

// DefaultCGNATRange is the cgnat range when none is given: the shared
// address space of RFC 6598.
var DefaultCGNATRange = netip.MustParsePrefix("100.64.0.0/10")

// CGNAT is a rule's `cgnat:` option: a request whose value (the entry of
// the rule's own descriptor) is an address or prefix inside one of Ranges
// is decided against the rule's limits multiplied by Multiplier, on a
// counter of its own (Rule.Raised).
type CGNAT struct {
	// Multiplier raises requests_per_unit (and a token bucket's burst);
	// at least 2.
	Multiplier uint32
	// Ranges are the carrier-grade NAT prefixes, masked; IPv4 ones
	// written as IPv4.
	Ranges []netip.Prefix
	// Line is the line of the `cgnat:` key.
	Line int
}

// contains reports whether request value v is an address or prefix
// inside one of c's ranges.
func (c *CGNAT) contains(v string) bool {
	p, ok := parseIPValue(v)
	if !ok {
		return false
	}
	for _, r := range c.Ranges {
		if r.Addr().Is4() == p.Addr().Is4() && r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// prefixTable holds the CIDR-valued nodes of one key at one level, by
// prefix, and the distinct prefix lengths of each family longest first:
// a lookup masks the request address to each length and probes the map,
// so its cost grows with the number of lengths, not of prefixes, and the
// first hit is the most specific prefix.
type prefixTable struct {
	v4, v6 []int
	nodes  map[netip.Prefix]*node
}

func (t *prefixTable) add(n *node) {
	if t.nodes == nil {
		t.nodes = map[netip.Prefix]*node{}
	}
	t.nodes[n.prefix] = n
	lens := &t.v6
	if n.prefix.Addr().Is4() {
		lens = &t.v4
	}
	if !slices.Contains(*lens, n.prefix.Bits()) {
		*lens = append(*lens, n.prefix.Bits())
		slices.SortFunc(*lens, func(a, b int) int { return b - a })
	}
}

// lookup returns the node of the longest configured prefix that holds
// request value v (an address, or a prefix no shorter than it), nil when
// none does or v is not an address.
func (t *prefixTable) lookup(v string) *node {
	p, ok := parseIPValue(v)
	if !ok {
		return nil
	}
	lens := t.v6
	if p.Addr().Is4() {
		lens = t.v4
	}
	for _, l := range lens {
		if l > p.Bits() {
			continue
		}
		q, err := p.Addr().Prefix(l)
		if err != nil {
			continue
		}
		if n := t.nodes[q]; n != nil {
			return n
		}
	}
	return nil
}

// maxIPValue bounds the request values parsed as addresses (the longest
// IPv6 text with a prefix length is 49 bytes).
const maxIPValue = 64

// parseIPValue parses a request value as an address (a full-length
// prefix: what Envoy's remote_address action sends) or a prefix (what
// masked_remote_address sends, "192.168.1.0/24"), masked. An IPv4-mapped
// IPv6 address or prefix is its IPv4 form; an IPv6 zone is dropped. An
// address as a header may carry it, in brackets or with a port
// ("[2001:db8::7]", "[2001:db8::7]:443", "203.0.113.7:443"), is the
// address alone: a client must not get a fresh counter per spelling or
// per source port. ok is false for anything else.
func parseIPValue(v string) (netip.Prefix, bool) {
	if len(v) == 0 || len(v) > maxIPValue {
		return netip.Prefix{}, false
	}
	if strings.IndexByte(v, '/') >= 0 {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Prefix{}, false
		}
		a, bits := p.Addr(), p.Bits()
		if a.Is4In6() {
			if bits < 96 {
				return netip.Prefix{}, false
			}
			a, bits = a.Unmap(), bits-96
		}
		return netip.PrefixFrom(a, bits).Masked(), true
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		if a, err = hostAddr(v); err != nil {
			return netip.Prefix{}, false
		}
	}
	a = a.WithZone("").Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true
}

// hostAddr parses v as "[IPv6]", "[IPv6]:port" or "IPv4:port" (the forms
// of RFC 3986's host and of X-Forwarded-For and Forwarded entries) and
// returns the address. Brackets around an IPv4 address are refused, as
// netip.ParseAddrPort refuses them.
func hostAddr(v string) (netip.Addr, error) {
	if v[0] == '[' && v[len(v)-1] == ']' {
		a, err := netip.ParseAddr(v[1 : len(v)-1])
		if err == nil && !a.Is6() {
			err = errBracketedIPv4
		}
		return a, err
	}
	ap, err := netip.ParseAddrPort(v)
	return ap.Addr(), err
}

var errBracketedIPv4 = errors.New("brackets around an IPv4 address")

// keyedAddress is the identity value of request value v on a level with
// ipv6_prefix bits: an IPv4 address (or IPv4-mapped IPv6) as its /32,
// written as the address; an IPv6 address or longer prefix masked to
// bits, written as a prefix; a shorter prefix as itself. A value that is
// not an address is kept: it cannot parse, so it never equals a
// normalized value.
func keyedAddress(v string, bits int) string {
	p, ok := parseIPValue(v)
	if !ok {
		return v
	}
	if p.Addr().Is4() {
		if p.Bits() == 32 {
			return p.Addr().String()
		}
		return p.String()
	}
	if p.Bits() > bits {
		p, _ = p.Addr().Prefix(bits)
	}
	return p.String()
}

// canonAddrValue is the canonical text of value v when it is an address
// or prefix (parseIPValue: IPv4-mapped IPv6 as IPv4, zone dropped, IPv6
// in RFC 5952 form, a prefix masked), so that every spelling of one
// address compares and keys alike; any other value is returned as it
// is. It is idempotent, and a value it keeps never parses as an address,
// so distinct addresses and non-address values stay distinct.
func canonAddrValue(v string) string {
	p, ok := parseIPValue(v)
	if !ok {
		return v
	}
	var buf [maxIPValue]byte
	var b []byte
	if p.Bits() == p.Addr().BitLen() && strings.IndexByte(v, '/') < 0 {
		b = p.Addr().AppendTo(buf[:0])
	} else {
		b = p.AppendTo(buf[:0])
	}
	if string(b) == v {
		return v // already canonical: no allocation
	}
	return string(b)
}

// cidrValue reports whether a config value is meant as a CIDR: it holds a
// '/' and what precedes it is an IP address.
func cidrValue(v string) bool {
	i := strings.IndexByte(v, '/')
	if i < 0 {
		return false
	}
	_, err := netip.ParseAddr(v[:i])
	return err == nil
}

// prefixLike reports whether config value v, which is not a CIDR value,
// is still written as one: hex digits, dots and colons, with at least
// one dot or colon, then '/' and decimal digits (10.00.0.0/8, 10.0.0/8).
// Such a value is meant as a prefix, so it is refused rather than kept
// as a string that no address ever equals.
func prefixLike(v string) bool {
	i := strings.IndexByte(v, '/')
	if i <= 0 || i == len(v)-1 || !strings.ContainsAny(v[:i], ".:") {
		return false
	}
	if strings.Trim(v[:i], "0123456789abcdefABCDEF.:") != "" {
		return false
	}
	for _, c := range v[i+1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// suggestPrefix is the prefix a malformed IPv4 one most likely means:
// leading zeros dropped from each part and missing trailing parts
// written as 0 (10.00.0.0/8 and 10.0.0/8 are 10.0.0.0/8), masked; "" when
// that does not give a valid prefix.
func suggestPrefix(v string) string {
	i := strings.IndexByte(v, '/')
	parts := strings.Split(v[:i], ".")
	if len(parts) < 2 || len(parts) > 4 {
		return ""
	}
	for j, s := range parts {
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return ""
		}
		parts[j] = strconv.FormatUint(n, 10)
	}
	for len(parts) < 4 {
		parts = append(parts, "0")
	}
	pf, err := netip.ParsePrefix(strings.Join(parts, ".") + v[i:])
	if err != nil {
		return ""
	}
	return pf.Masked().String()
}

// prefixTypo reports config value v (at line), written as a prefix but
// not one (prefixLike), with the prefix it most likely means.
func (p *parser) prefixTypo(v string, line int) {
	_, err := netip.ParsePrefix(v)
	if s := suggestPrefix(v); s != "" {
		p.errs.add(p.file, line, "value %q is written as a CIDR prefix but is not one (%v); did you mean %q?", v, err, s)
		return
	}
	p.errs.add(p.file, line, "value %q is written as a CIDR prefix but is not one (%v)", v, err)
}

// cidr parses the CIDR value of node n (written at line), reporting
// malformed prefixes, set host bits and IPv4-mapped IPv6 prefixes.
func (p *parser) cidr(n *node, line int) {
	pf, err := netip.ParsePrefix(n.value)
	if err != nil {
		p.errs.add(p.file, line, "value %q is not a valid CIDR prefix: %v", n.value, err)
		return
	}
	if pf.Addr().Is4In6() {
		p.errs.add(p.file, line, "value %q is an IPv4-mapped IPv6 prefix; write it as IPv4 (requests from mapped addresses match IPv4 prefixes)", n.value)
		return
	}
	if m := pf.Masked(); m != pf {
		p.errs.add(p.file, line, "value %q has bits set after the prefix length; did you mean %q?", n.value, m.String())
		return
	}
	n.prefix = pf
}

// ipv6Prefix parses `ipv6_prefix:`: an integer in [1, 128], true or null
// (DefaultIPv6Prefix), or false (off).
func (p *parser) ipv6Prefix(v *yaml.Node) int {
	if isNull(v) {
		return DefaultIPv6Prefix
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!bool" {
		if p.boolean(v, "ipv6_prefix") {
			return DefaultIPv6Prefix
		}
		return 0
	}
	i, ok := p.integer(v, "ipv6_prefix", 1, 128)
	if !ok {
		return 0
	}
	return int(i)
}

// cgnat parses `cgnat:`: true or null (the defaults), or a mapping of
// multiplier (at least 2; DefaultCGNATMultiplier when absent) and ranges
// (a non-empty list of CIDR prefixes; DefaultCGNATRange when absent).
// false, and a mapping with a reported problem, give nil.
func (p *parser) cgnat(kn, v *yaml.Node) *CGNAT {
	c := &CGNAT{Multiplier: DefaultCGNATMultiplier, Ranges: []netip.Prefix{DefaultCGNATRange}, Line: kn.Line}
	switch {
	case isNull(v):
		return c
	case v.Kind == yaml.ScalarNode && v.Tag == "!!bool":
		if p.boolean(v, "cgnat") {
			return c
		}
		return nil
	case v.Kind != yaml.MappingNode:
		p.errs.add(p.file, v.Line, "cgnat must be a mapping {multiplier: 10, ranges: [100.64.0.0/10]} or true, got %s", kindName(v))
		return nil
	}
	before := len(p.errs.errs)
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "multiplier":
			if m, ok := p.integer(v, "cgnat multiplier", 2, 1_000_000); ok {
				c.Multiplier = uint32(m)
			}
		case "ranges":
			c.Ranges = p.cgnatRanges(v)
		default:
			p.unknown(kn, k, "cgnat", nil, cgnatKeys)
		}
	})
	if len(p.errs.errs) != before {
		// Reported: the rule is not compiled with a cgnat that is not
		// the one written, which would report again in its terms.
		return nil
	}
	return c
}

func (p *parser) cgnatRanges(v *yaml.Node) []netip.Prefix {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errs.add(p.file, v.Line, "cgnat ranges must be a non-empty list of CIDR prefixes, got %s", listKindName(v))
		return nil
	}
	var out []netip.Prefix
	for _, it := range v.Content {
		it = deref(it)
		s, ok := p.str(it, "cgnat range")
		if !ok {
			continue
		}
		n := &node{value: s}
		if !cidrValue(s) {
			p.errs.add(p.file, it.Line, "cgnat range %q is not a CIDR prefix (want e.g. 100.64.0.0/10)", s)
			continue
		}
		before := len(p.errs.errs)
		p.cidr(n, it.Line)
		if len(p.errs.errs) == before {
			out = append(out, n.prefix)
		}
	}
	return out
}
