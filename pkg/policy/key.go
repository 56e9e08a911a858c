package policy

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// Backend key encoding.
//
// Every key is built from a canonical byte string C that is a sequence of
// length-prefixed components, each written as "<decimal length>:<bytes>,"
// (a netstring). A sequence of netstrings decodes uniquely, and the
// grammar of C fixes how many components follow each count, so different
// tuples always give different C:
//
//	C = ns("rl1") ns(domain) ns("rule") ns(depth) { ns(key) ns(kind) ns(value) }×depth
//	    ns(limit index) ns(algorithm) ns(window)  ns(n) { ns(entry key) ns(entry value) }×n
//
// kind is "-" (value-less), "=" (exact value), "*" (wildcard pattern) or
// "/" (CIDR prefix); window is "<UNIT>x<multiplier>" plus "/cal" for
// calendar windows. The identity entries are the request entries (the
// pattern in place of the value on share_threshold levels).
//
// A request override (Set.Override) has no rule path and carries its rate:
//
//	C = ns("rl1") ns(domain) ns("override") ns("0") ns("fixed_window") ns("<UNIT>x1")
//	    ns(requests_per_unit) ns(n) { ns(entry key) ns(entry value) }×n
//
// The third component ("rule" or "override") selects the grammar, so a
// rule key and an override key never share C.
//
// The raised counter of a rule with cgnat (Rule.Raised) has two more
// components after the window, ns("cgnat") ns(multiplier); a count
// never starts with a letter, so it never shares C with the rule's other
// counters. Identity values on levels with ipv6_prefix are the keyed
// address (keyedAddress). The non-critical share of a rule with reserve
// (Rule.Reduced) keeps the rule's keys: both count on one counter.
//
// For config rules requests_per_unit and burst are not part of C, so a
// raised or lowered limit keeps counting on the same counter; the
// algorithm and window are, because the state of one algorithm or window
// length means nothing to another. An override has no config to raise:
// its rate is all that tells one request's override from another's on
// the same entries (10/minute and 1000/minute in one request are two
// counters), so it is part of C.
//
// The key is KeyOptions.Prefix followed by the first 128 bits of
// SHA-256(C) in unpadded base64url (22 bytes, alphabet A-Z a-z 0-9 - _),
// so no descriptor value reaches the store; with KeyOptions.ClearText it is
// Prefix followed by C itself.

const keyVersion = "rl1"

func appendNS(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ',')
}

func appendNSInt(b []byte, i int) []byte {
	var tmp [20]byte
	return appendNS(b, string(strconv.AppendInt(tmp[:0], int64(i), 10)))
}

var kindTags = [...]string{valueNone: "-", valueExact: "=", valuePattern: "*", valueCIDR: "/"}

func windowTag(sp *Spec) string {
	t := sp.Unit.String() + "x" + strconv.FormatUint(uint64(sp.UnitMultiplier), 10)
	if sp.Calendar {
		t += "/cal"
	}
	return t
}

func rulePrefix(domain string, path []*node, i int, sp *Spec) []byte {
	b := appendNS(nil, keyVersion)
	b = appendNS(b, domain)
	b = appendNS(b, "rule")
	b = appendNSInt(b, len(path))
	for _, n := range path {
		b = appendNS(b, n.key)
		b = appendNS(b, kindTags[n.kind])
		b = appendNS(b, n.value)
	}
	b = appendNSInt(b, i)
	b = appendNS(b, AlgorithmName(sp.Algorithm))
	return appendNS(b, windowTag(sp))
}

func overridePrefix(domain string, sp *Spec) []byte {
	b := appendNS(nil, keyVersion)
	b = appendNS(b, domain)
	b = appendNS(b, "override")
	b = appendNSInt(b, 0)
	b = appendNS(b, AlgorithmName(sp.Algorithm))
	b = appendNS(b, windowTag(sp))
	var tmp [10]byte
	return appendNS(b, string(strconv.AppendUint(tmp[:0], uint64(sp.RequestsPerUnit), 10)))
}

// Key returns the backend key of m.Rule.Limits[i] for this match (see the
// encoding above). For a config rule it is injective over (domain, rule
// path, limit index, algorithm, window, identity entries) and independent
// of requests_per_unit and burst; for a request override (Set.Override)
// over (domain, unit, requests_per_unit, entries). It returns "" when m
// has no rule or i is out of range.
func (s *Set) Key(m Match, i int) string {
	r := m.Rule
	if r == nil || i < 0 || i >= len(r.keyPre) {
		return ""
	}
	var prefix string
	var clear bool
	if s != nil {
		prefix, clear = s.keys.Prefix, s.keys.ClearText
	}
	var arr [384]byte
	b := append(arr[:0], r.keyPre[i]...)
	b = appendNSInt(b, len(m.id))
	for _, e := range m.id {
		b = appendNS(b, e.Key)
		b = appendNS(b, e.Value)
	}
	if clear {
		return prefix + string(b)
	}
	sum := sha256.Sum256(b)
	var out [22]byte
	base64.RawURLEncoding.Encode(out[:], sum[:16])
	return prefix + string(out[:])
}
