package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
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
	valueCIDR                     // value that is an IP prefix (address.go)
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
	prefix        netip.Prefix    // the value of a valueCIDR node
	ipv6Prefix    int             // ipv6_prefix: (0: off)
	// canon: the node's key at its level has CIDR values or ipv6_prefix,
	// so an address value of its entry is compared and keyed in its
	// canonical form (canonAddrValue).
	canon   bool
	cgnat   *CGNAT         // cgnat:, nil when absent
	reserve *Reserve       // reserve:, nil when absent
	penalty *penaltyOption // penalty:, nil when absent
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
	// literal compares every descriptor value as a string
	// (LoadOptions.LiteralValues).
	literal bool
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

func parseFile(file string, data []byte, errs *errList, literal bool) *fileConfig {
	p := &parser{file: file, errs: errs, literal: literal}
	if !utf8.Valid(data) {
		// The YAML decoder would sniff a UTF-16 byte-order mark and decode
		// other bytes as UTF-16; config files are UTF-8 only.
		line, msg := notUTF8(data)
		errs.add(file, line, "%s", msg)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			errs.add(file, 1, "empty config file: domain is required")
			return nil
		}
		p.yamlError(data, err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		errs.add(file, extra.Line, "a config file holds one YAML document; found a second one")
		return nil
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(data, err)
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

// notUTF8 describes the first byte of data that is not UTF-8, and its
// line.
func notUTF8(data []byte) (line int, msg string) {
	off := 0
	for off < len(data) {
		r, size := utf8.DecodeRune(data[off:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		off += size
	}
	line = 1 + bytes.Count(data[:off], []byte("\n"))
	what := ""
	if bytes.HasPrefix(data, []byte{0xFF, 0xFE}) || bytes.HasPrefix(data, []byte{0xFE, 0xFF}) {
		what = " (a UTF-16 byte-order mark)"
	}
	return line, fmt.Sprintf("not UTF-8: byte 0x%02X at offset %d%s; save the config file as UTF-8", data[off], off, what)
}
