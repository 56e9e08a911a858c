package policy

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func loadYAML(t testing.TB, yml string) *Set {
	t.Helper()
	s, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(yml)})
	if err != nil {
		t.Fatalf("LoadSources: %v", err)
	}
	return s
}

const cidrConfig = `
domain: edge
descriptors:
  - key: remote_address
    value: 10.0.0.0/8
    rate_limit: {unit: minute, requests_per_unit: 8}
  - key: remote_address
    value: 10.1.0.0/16
    rate_limit: {unit: minute, requests_per_unit: 16}
  - key: remote_address
    value: 10.1.2.3
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    value: 10.*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: remote_address
    value: 2001:db8::/32
    rate_limit: {unit: minute, requests_per_unit: 32}
  - key: remote_address
    value: 2001:db8:aa::/48
    rate_limit: {unit: minute, requests_per_unit: 48}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: masked_remote_address
    value: 192.168.0.0/16
    rate_limit: {unit: hour, requests_per_unit: 16}
  - key: masked_remote_address
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestMatchCIDR: an exact value wins, then the most specific prefix
// holding the value, then a wildcard, then the value-less default; with
// the values Envoy's remote_address (an address) and
// masked_remote_address (a prefix) actions send.
func TestMatchCIDR(t *testing.T) {
	s := loadYAML(t, cidrConfig)
	runMatch(t, s, []matchCase{
		{"exact beats prefix", "edge", ents("remote_address", "10.1.2.3"), "min:3", "edge.remote_address_10.1.2.3"},
		{"longest prefix", "edge", ents("remote_address", "10.1.9.9"), "min:16", "edge.remote_address_10.1.0.0/16"},
		{"shorter prefix", "edge", ents("remote_address", "10.200.0.1"), "min:8", "edge.remote_address_10.0.0.0/8"},
		{"mapped IPv4", "edge", ents("remote_address", "::ffff:10.1.9.9"), "min:16", ""},
		{"IPv6 longest", "edge", ents("remote_address", "2001:db8:aa:1::7"), "min:48", ""},
		{"IPv6 shorter", "edge", ents("remote_address", "2001:db8:bb::7"), "min:32", ""},
		{"IPv6 zone dropped", "edge", ents("remote_address", "2001:db8:aa::1%eth0"), "min:48", ""},
		{"outside: default", "edge", ents("remote_address", "11.0.0.1"), "min:1", "edge.remote_address"},
		{"not an address: wildcard", "edge", ents("remote_address", "10.x"), "min:4", ""},
		{"not an address: default", "edge", ents("remote_address", "host"), "min:1", ""},
		{"masked inside", "edge", ents("masked_remote_address", "192.168.1.0/24"), "hou:16", ""},
		{"masked wider than the prefix", "edge", ents("masked_remote_address", "192.0.0.0/8"), "hou:1", ""},
		{"masked outside", "edge", ents("masked_remote_address", "172.16.0.0/24"), "hou:1", ""},
	})
}

// TestLiteralValues: with LoadOptions.LiteralValues (reference mode) a
// prefix-shaped value is an ordinary string, as envoyproxy/ratelimit
// compares it: it matches only the same string, not addresses inside it.
func TestLiteralValues(t *testing.T) {
	s, _, err := LoadSources(LoadOptions{LiteralValues: true}, Source{Name: "t.yaml", Data: []byte(cidrConfig)})
	if err != nil {
		t.Fatalf("LoadSources: %v", err)
	}
	runMatch(t, s, []matchCase{
		{"same string", "edge", ents("remote_address", "10.0.0.0/8"), "min:8", "edge.remote_address_10.0.0.0/8"},
		{"address inside: the wildcard, not the prefix", "edge", ents("remote_address", "10.200.0.1"), "min:4", ""},
		{"IPv6 inside: default", "edge", ents("remote_address", "2001:db8:aa:1::7"), "min:1", "edge.remote_address"},
		{"exact still exact", "edge", ents("remote_address", "10.1.2.3"), "min:3", "edge.remote_address_10.1.2.3"},
		{"masked: same string only", "edge", ents("masked_remote_address", "192.168.1.0/24"), "hou:1", ""},
	})
}

// TestMatchCIDRManyPrefixes: many prefixes of few lengths match by
// length, and each request finds its most specific prefix.
func TestMatchCIDRManyPrefixes(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := 0; i < 256; i++ {
		b.WriteString("  - key: ip\n    value: 10." + itoa(i) + ".0.0/16\n    rate_limit: {unit: second, requests_per_unit: " + itoa(i+1) + "}\n")
		b.WriteString("  - key: ip\n    value: 10." + itoa(i) + ".7.0/24\n    rate_limit: {unit: minute, requests_per_unit: " + itoa(i+1) + "}\n")
	}
	s := loadYAML(t, b.String())
	for i := 0; i < 256; i++ {
		m, ok := s.Match("d", ents("ip", "10."+itoa(i)+".8.1"))
		if got, want := describe(m, ok), "sec:"+itoa(i+1); got != want {
			t.Fatalf("10.%d.8.1: %s, want %s", i, got, want)
		}
		m, ok = s.Match("d", ents("ip", "10."+itoa(i)+".7.1"))
		if got, want := describe(m, ok), "min:"+itoa(i+1); got != want {
			t.Fatalf("10.%d.7.1: %s, want %s", i, got, want)
		}
	}
}

func TestLoadAddressErrors(t *testing.T) {
	cases := []struct{ name, yml, want string }{
		{"bad length", "domain: d\ndescriptors:\n  - key: ip\n    value: 10.0.0.0/33\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: value \"10.0.0.0/33\" is not a valid CIDR prefix"},
		{"host bits", "domain: d\ndescriptors:\n  - key: ip\n    value: 10.0.0.1/8\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: value \"10.0.0.1/8\" has bits set after the prefix length; did you mean \"10.0.0.0/8\"?"},
		{"mapped", "domain: d\ndescriptors:\n  - key: ip\n    value: ::ffff:10.0.0.0/104\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: value \"::ffff:10.0.0.0/104\" is an IPv4-mapped IPv6 prefix"},
		{"duplicate prefix", "domain: d\ndescriptors:\n  - key: ip\n    value: 10.0.0.0/8\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: ip\n    value: 10.0.0.0/8\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:6: duplicate descriptor composite key"},
		{"ipv6_prefix range", "domain: d\ndescriptors:\n  - key: ip\n    ipv6_prefix: 129\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: ipv6_prefix: 129 is out of range"},
		{"cgnat bad range", "domain: d\ndescriptors:\n  - key: ip\n    cgnat: {ranges: [100.64.0.0/40]}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: value \"100.64.0.0/40\" is not a valid CIDR prefix"},
		{"cgnat multiplier", "domain: d\ndescriptors:\n  - key: ip\n    cgnat: {multiplier: 1}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: cgnat multiplier must be at least 2"},
		{"cgnat without limit", "domain: d\ndescriptors:\n  - key: ip\n    cgnat: true\n", "t.yaml:4: cgnat applies to the limits of its descriptor"},
		{"cgnat overflow", "domain: d\ndescriptors:\n  - key: ip\n    cgnat: {multiplier: 1000000}\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n", "t.yaml:4: cgnat: requests_per_unit 4294967295 × multiplier 1000000 overflows"},
		{"reserve share", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: 1.5}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: reserve share must be a number between 0 and 1"},
		{"reserve incomplete", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, share: 0.5}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: reserve needs entry, value and share"},
		{"reserve token bucket", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: 0.5}\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket}\n", "t.yaml:4: reserve applies to fixed_window, sliding_window, sliding_log and concurrency limits"},
		{"reserve child", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: 0.5}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: priority\n        rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: reserve entry \"priority\" is also the key of a child descriptor (line 7)"},
		{"reserve saturated_share above share", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: 0.5, saturated_share: 0.6}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "t.yaml:4: reserve saturated_share 0.6 must be below share 0.5"},
		{"reserve unknown key", "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: 0.5, shares: 1}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "unknown key \"shares\" in reserve"},
	}
	for _, c := range cases {
		_, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(c.yml)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
		var ce *ConfigError
		if err != nil && !errors.As(err, &ce) {
			t.Errorf("%s: %T is not a *ConfigError", c.name, err)
		}
	}
}

const ipv6Config = `
domain: edge
descriptors:
  - key: remote_address
    ipv6_prefix: %s
    cgnat: {multiplier: 10, ranges: [100.64.0.0/10, "2001:db8:c9::/48"]}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: masked_remote_address
    ipv6_prefix: 56
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: raw
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestIPv6PrefixKeys: addresses in one IPv6 /64 share a key, IPv4 is keyed
// per address (mapped IPv6 included), and values that are not addresses
// keep their own keys.
func TestIPv6PrefixKeys(t *testing.T) {
	for _, form := range []string{"64", "true", "null", ""} {
		s := loadYAML(t, strings.Replace(ipv6Config, "%s", form, 1))
		key := func(k, v string) string {
			m, ok := s.Match("edge", ents(k, v))
			if !ok {
				t.Fatalf("ipv6_prefix %q: %s=%s did not match", form, k, v)
			}
			return s.Key(m, 0)
		}
		same := [][2]string{
			{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff"},
			{"2001:db8:1:2::1", "2001:db8:1:2::/64"},
			{"2001:db8:1:2::1", "2001:db8:1:2:8000::/65"},
			{"2001:db8:1:2::1", "2001:DB8:1:2::9"},
			{"2001:db8:1:2::1", "2001:db8:1:2::9%eth0"},
			{"192.0.2.1", "::ffff:192.0.2.1"},
			{"192.0.2.1", "192.0.2.1/32"},
			{"2001:db8:1:2::1", "[2001:db8:1:2::9]"},
			{"2001:db8:1:2::1", "[2001:db8:1:2::9]:443"},
			{"2001:db8:1:2::1", "[2001:DB8:1:2::9%eth0]:443"},
			{"192.0.2.1", "192.0.2.1:443"},
			{"192.0.2.1", "[::ffff:192.0.2.1]"},
			{"192.0.2.1", "[::ffff:192.0.2.1]:50000"},
		}
		for _, p := range same {
			if a, b := key("remote_address", p[0]), key("remote_address", p[1]); a != b {
				t.Errorf("ipv6_prefix %q: %s and %s have different keys", form, p[0], p[1])
			}
		}
		differ := [][2]string{
			{"2001:db8:1:2::1", "2001:db8:1:3::1"},
			{"192.0.2.1", "192.0.2.2"},
			{"2001:db8:1:2::/64", "2001:db8:1::/48"},
			{"host-a", "host-b"},
			{"2001:db8:1:2::/64", "2001:db8:1:2::/64x"},
			{"100.64.0.1", "100.64.0.2"},
			{"[2001:db8:1:2::1]", "[2001:db8:1:3::1]:443"},
			{"192.0.2.1:443", "192.0.2.2:443"},
			{"192.0.2.1:443", "[2001:db8:1:2::1]:443"},
		}
		for _, p := range differ {
			if a, b := key("remote_address", p[0]), key("remote_address", p[1]); a == b {
				t.Errorf("ipv6_prefix %q: %s and %s share a key", form, p[0], p[1])
			}
		}
		if a, b := key("masked_remote_address", "2001:db8:1:2::/64"), key("masked_remote_address", "2001:db8:1:3::/64"); a != b {
			t.Errorf("ipv6_prefix 56: two /64 in one /56 have different keys")
		}
		if a, b := key("raw", "2001:db8:1:2::1"), key("raw", "2001:db8:1:2::2"); a == b {
			t.Errorf("without ipv6_prefix two addresses share a key")
		}
	}
}

// TestCGNATVariant: addresses inside a cgnat range get the raised limit on
// a counter of their own; others the rule's limit.
func TestCGNATVariant(t *testing.T) {
	s := loadYAML(t, strings.Replace(ipv6Config, "%s", "64", 1))
	cases := []struct {
		value  string
		raised bool
	}{
		{"100.64.0.1", true},
		{"100.127.255.255", true},
		{"100.128.0.0", false},
		{"::ffff:100.64.3.4", true},
		{"100.64.1.0/24", true},
		{"100.0.0.0/8", false},
		{"2001:db8:c9:1::1", true},
		{"2001:db8:ca::1", false},
		{"192.0.2.1", false},
		{"100.64.0.1:443", true},
		{"[::ffff:100.64.3.4]:80", true},
		{"[2001:db8:c9:1::1]:443", true},
		{"100.128.0.0:443", false},
		{"not-an-ip", false},
	}
	for _, c := range cases {
		m, ok := s.Match("edge", ents("remote_address", c.value))
		if !ok {
			t.Fatalf("%s: no match", c.value)
		}
		if m.Rule.Raised != c.raised {
			t.Errorf("%s: Raised = %t, want %t", c.value, m.Rule.Raised, c.raised)
		}
		want := int64(5)
		if c.raised {
			want = 50
			if m.Rule.Base == nil || m.Rule.Base.Limits[0].Limit.Rate != 5 {
				t.Errorf("%s: the raised variant does not name its base rule", c.value)
			}
		}
		if got := m.Rule.Limits[0].Limit.Rate; got != want {
			t.Errorf("%s: rate %d, want %d", c.value, got, want)
		}
	}
	// The raised counter of an address never is the counter of a normal
	// one, even for the same identity.
	base, _ := s.Match("edge", ents("remote_address", "100.64.0.1"))
	normal := base
	normal.Rule = base.Rule.Base
	if s.Key(base, 0) == s.Key(normal, 0) {
		t.Error("raised and normal counters share a key")
	}
}

const reserveConfig = `
domain: api
descriptors:
  - key: route
    reserve: {entry: priority, value: critical, share: 0.8}
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 7, algorithm: sliding_log}
`

// TestReserveVariant: a critical request is decided against the whole
// limits, any other against floor(share × limit), on the same keys.
func TestReserveVariant(t *testing.T) {
	s := loadYAML(t, reserveConfig)
	cases := []struct {
		entries  []Entry
		critical bool
	}{
		{ents("route", "/a", "priority", "critical"), true},
		{ents("route", "/a", "priority", "low"), false},
		{ents("route", "/a", "priority", ""), false},
		{ents("route", "/a"), false},
	}
	var keys []string
	for _, c := range cases {
		m, ok := s.Match("api", c.entries)
		if !ok {
			t.Fatalf("%v: no match", c.entries)
		}
		want := []int64{10, 7}
		if !c.critical {
			want = []int64{8, 5}
		}
		for i, w := range want {
			if got := m.Rule.Limits[i].Limit.Rate; got != w {
				t.Errorf("%v: limit %d rate %d, want %d", c.entries, i, got, w)
			}
		}
		if m.Rule.Reduced == c.critical {
			t.Errorf("%v: Reduced = %t", c.entries, m.Rule.Reduced)
		}
		keys = append(keys, s.Key(m, 0)+s.Key(m, 1))
	}
	for _, k := range keys[1:] {
		if k != keys[0] {
			t.Fatal("critical and other requests count on different keys")
		}
	}
	if _, ok := s.Match("api", ents("route", "/a", "other", "x")); ok {
		t.Error("a trailing entry that is not the reserve entry matched")
	}
}

func TestReducedRate(t *testing.T) {
	for _, c := range []struct {
		rate  int64
		share float64
		want  int64
	}{{10, 0.8, 8}, {7, 0.8, 5}, {100, 0.7, 70}, {3, 0.1, 0}, {1000, 0.29, 290}, {1, 0.999, 0}} {
		if got := reducedRate(c.rate, c.share); got != c.want {
			t.Errorf("reducedRate(%d, %g) = %d, want %d", c.rate, c.share, got, c.want)
		}
	}
}

// BenchmarkMatchCIDR matches remote_address values against 10,000
// prefixes of three lengths on one level (one IPv4 and one IPv6 request,
// alternating), a value-less rule with ipv6_prefix, and for comparison a
// value-less rule without options; each with its key.
func BenchmarkMatchCIDR(b *testing.B) {
	var y strings.Builder
	y.WriteString("domain: d\ndescriptors:\n")
	for i := 0; i < 4000; i++ {
		y.WriteString("  - key: ip\n    value: 10." + itoa(i/256) + "." + itoa(i%256) + ".0/24\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	for i := 0; i < 3000; i++ {
		y.WriteString("  - key: ip\n    value: 172." + itoa(16+i/256) + "." + itoa(i%256) + ".128/25\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	for i := 0; i < 3000; i++ {
		y.WriteString("  - key: ip\n    value: 2001:db8:" + strconv.FormatInt(int64(i), 16) + "::/48\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	y.WriteString("  - key: ip\n    ipv6_prefix: 64\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	y.WriteString("  - key: raw\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	s := loadYAML(b, y.String())
	for _, c := range []struct {
		name   string
		values []string
	}{
		{"prefixes", []string{"10.7.200.9", "2001:db8:bb8:1::1"}},
		{"ipv6_prefix", []string{"192.0.2.1", "2001:db9::1"}},
		{"plain", []string{"192.0.2.1", "2001:db9::1"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			key := "ip"
			if c.name == "plain" {
				key = "raw"
			}
			es := [][]Entry{ents(key, c.values[0]), ents(key, c.values[1])}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				m, ok := s.Match("d", es[i&1])
				if !ok {
					b.Fatal("no match")
				}
				_ = s.Key(m, 0)
			}
		})
	}
}

// TestCIDRShareAndNestedIPv6Prefix: share_threshold makes a CIDR value
// one counter; ipv6_prefix on an intermediate level keys the rules below.
func TestCIDRShareAndNestedIPv6Prefix(t *testing.T) {
	s := loadYAML(t, `
domain: d
descriptors:
  - key: ip
    value: 10.0.0.0/8
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: ip
    ipv6_prefix: 48
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
`)
	key := func(es ...string) string {
		m, ok := s.Match("d", ents(es...))
		if !ok {
			t.Fatalf("%v: no match", es)
		}
		return s.Key(m, 0)
	}
	if key("ip", "10.1.1.1") != key("ip", "10.200.3.4") {
		t.Error("share_threshold CIDR: two addresses inside have different keys")
	}
	if key("ip", "2001:db8:5:1::1", "path", "/a") != key("ip", "2001:db8:5:ffff::2", "path", "/a") {
		t.Error("ipv6_prefix 48 on the parent: two addresses of one /48 have different keys")
	}
	if key("ip", "2001:db8:5::1", "path", "/a") == key("ip", "2001:db8:6::1", "path", "/a") {
		t.Error("ipv6_prefix 48 on the parent: two /48 share a key")
	}
}

// edgeConfig is docs/config.md's address-prefix example, with an IPv6
// exact value written in a non-canonical spelling and a non-address
// exact value next to them.
const edgeConfig = `
domain: edge
descriptors:
  - key: remote_address
    value: 10.0.0.0/8
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: remote_address
    value: 10.1.0.0/16
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: remote_address
    value: 10.1.2.3
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    value: 2001:DB8::0:1
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: remote_address
    value: Host-A
    rate_limit: {unit: minute, requests_per_unit: 9}
  - key: remote_address
    ipv6_prefix: 64
    cgnat: {multiplier: 10, ranges: [100.64.0.0/10]}
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value: 10.1.2.3
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestExactAddressAnySpelling: on a key with CIDR values or ipv6_prefix
// an exact address value matches every spelling of that address
// (IPv4-mapped IPv6, upper case, zero groups, a zone) and each spelling
// counts on one key; non-address values and keys without address
// options stay byte-exact.
func TestExactAddressAnySpelling(t *testing.T) {
	s := loadYAML(t, edgeConfig)
	runMatch(t, s, []matchCase{
		{"exact", "edge", ents("remote_address", "10.1.2.3"), "min:5", "edge.remote_address_10.1.2.3"},
		{"mapped exact", "edge", ents("remote_address", "::ffff:10.1.2.3"), "min:5", "edge.remote_address_10.1.2.3"},
		{"mapped upper-case exact", "edge", ents("remote_address", "::FFFF:10.1.2.3"), "min:5", ""},
		{"mapped in /16", "edge", ents("remote_address", "::ffff:10.1.2.4"), "min:100", ""},
		{"IPv6 canonical", "edge", ents("remote_address", "2001:db8::1"), "min:7", ""},
		{"IPv6 as written", "edge", ents("remote_address", "2001:DB8::0:1"), "min:7", ""},
		{"IPv6 long form", "edge", ents("remote_address", "2001:0db8:0:0:0:0:0:1"), "min:7", ""},
		{"IPv6 zone", "edge", ents("remote_address", "2001:db8::1%eth0"), "min:7", ""},
		{"IPv6 in brackets", "edge", ents("remote_address", "[2001:db8::1]"), "min:7", ""},
		{"IPv6 in brackets with a port", "edge", ents("remote_address", "[2001:DB8::1]:443"), "min:7", ""},
		{"IPv4 with a port", "edge", ents("remote_address", "10.1.2.3:443"), "min:5", ""},
		{"IPv4 with a port in /16", "edge", ents("remote_address", "10.1.9.9:443"), "min:100", ""},
		{"IPv4 in brackets: not an address", "edge", ents("remote_address", "[10.1.2.3]"), "min:60", ""},
		{"non-address byte-exact", "edge", ents("remote_address", "Host-A"), "min:9", ""},
		{"non-address other case", "edge", ents("remote_address", "host-a"), "min:60", ""},
		{"key without address options: byte-exact", "edge", ents("user", "::ffff:10.1.2.3"), "min:1", ""},
		{"key without address options: exact", "edge", ents("user", "10.1.2.3"), "min:2", ""},
	})
	keyOf := func(v string) string {
		m, ok := s.Match("edge", ents("remote_address", v))
		if !ok {
			t.Fatalf("%s: no match", v)
		}
		return s.Key(m, 0)
	}
	for _, set := range [][]string{
		{"10.1.2.3", "::ffff:10.1.2.3", "::FFFF:10.1.2.3"},
		{"10.1.9.9", "::ffff:10.1.9.9", "::ffff:a01:909"},
		{"2001:db8::1", "2001:DB8::0:1", "2001:0db8::1%eth0"},
		{"11.0.0.1", "::ffff:11.0.0.1"},
		{"2001:db8::1", "[2001:db8::1]", "[2001:DB8::1]:443", "[2001:db8::1%eth0]:1"},
		{"10.1.2.3", "10.1.2.3:50000", "[::ffff:10.1.2.3]:1"},
	} {
		want := keyOf(set[0])
		for _, v := range set[1:] {
			if got := keyOf(v); got != want {
				t.Errorf("key of %q = %s, key of %q = %s: one address, two counters", v, got, set[0], want)
			}
		}
	}
	distinct := map[string]string{}
	for _, v := range []string{"10.1.2.3", "10.1.2.4", "10.1.9.9", "10.200.0.1", "11.0.0.1", "2001:db8::1", "Host-A", "host-a", "10.1.9.9/32"} {
		k := keyOf(v)
		if o, dup := distinct[k]; dup {
			t.Errorf("%q and %q share key %s", v, o, k)
		}
		distinct[k] = v
	}
}

// TestExactAddressDuplicateSpelling: two spellings of one address on an
// address key are one descriptor.
func TestExactAddressDuplicateSpelling(t *testing.T) {
	yml := "domain: d\ndescriptors:\n  - key: ip\n    value: 10.0.0.0/8\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: ip\n    value: 10.1.2.3\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: ip\n    value: ::ffff:10.1.2.3\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	_, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(yml)})
	if err == nil || !strings.Contains(err.Error(), "t.yaml:9: duplicate descriptor composite key") {
		t.Fatalf("error %v, want a duplicate at t.yaml:9", err)
	}
}

// TestLiteralValuesAddressSpelling: in reference mode an address value
// is a string: another spelling does not match it.
func TestLiteralValuesAddressSpelling(t *testing.T) {
	s, _, err := LoadSources(LoadOptions{LiteralValues: true}, Source{Name: "t.yaml", Data: []byte(edgeConfig)})
	if err != nil {
		t.Fatalf("LoadSources: %v", err)
	}
	runMatch(t, s, []matchCase{
		{"exact", "edge", ents("remote_address", "10.1.2.3"), "min:5", ""},
		{"mapped: default", "edge", ents("remote_address", "::ffff:10.1.2.3"), "min:60", ""},
		{"IPv6 as written", "edge", ents("remote_address", "2001:DB8::0:1"), "min:7", ""},
		{"IPv6 canonical: default", "edge", ents("remote_address", "2001:db8::1"), "min:60", ""},
	})
}

// TestLoadPrefixTypo: a value written as a prefix (hex digits, dots and
// colons, then /digits) that does not parse is a load error at its line,
// with the prefix it most likely means; in reference mode it is a
// string, and values merely containing a '/' are strings.
func TestLoadPrefixTypo(t *testing.T) {
	doc := func(v string) string {
		return "domain: d\ndescriptors:\n  - key: ip\n    value: " + v + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	}
	for _, c := range []struct{ value, want string }{
		{"10.00.0.0/8", `t.yaml:4: value "10.00.0.0/8" is written as a CIDR prefix but is not one`},
		{"10.00.0.0/8", `did you mean "10.0.0.0/8"?`},
		{"10.0.0/8", `did you mean "10.0.0.0/8"?`},
		{"192.168.1/24", `did you mean "192.168.1.0/24"?`},
		{"10.1.2.300/32", `t.yaml:4: value "10.1.2.300/32" is written as a CIDR prefix but is not one`},
		{"2001:db8:::/32", `t.yaml:4: value "2001:db8:::/32" is written as a CIDR prefix but is not one`},
	} {
		_, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(doc(c.value))})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.value, err, c.want)
		}
		if _, _, err := LoadSources(LoadOptions{LiteralValues: true}, Source{Name: "t.yaml", Data: []byte(doc(c.value))}); err != nil {
			t.Errorf("%s in reference mode: %v", c.value, err)
		}
	}
	if _, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(doc("10.300.0.0/8"))}); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("10.300.0.0/8: error %v, want one without a suggestion", err)
	}
	for _, v := range []string{"/api/v1", "a/b", "v1.2/3x", "1.2/", "host.example/8x", "cafe/8"} {
		if _, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(doc(v))}); err != nil {
			t.Errorf("%s: %v, want a plain string value", v, err)
		}
	}
}

// loadErrs loads yml and returns its error messages, one per line.
func loadErrs(t *testing.T, yml string) []string {
	t.Helper()
	_, _, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(yml)})
	if err == nil {
		t.Fatalf("no error loading:\n%s", yml)
	}
	return strings.Split(strings.TrimSpace(err.Error()), "\n")
}

// TestReserveOneError: an invalid reserve field is reported once, not
// again as missing; fields that are absent are named.
func TestReserveOneError(t *testing.T) {
	doc := func(reserve string) string {
		return "domain: d\ndescriptors:\n  - key: r\n    reserve: " + reserve + "\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	}
	for _, c := range []struct{ reserve, want string }{
		{"{entry: priority, value: critical, share: 1}", "t.yaml:4: reserve share must be a number between 0 and 1 (exclusive)"},
		{"{entry: priority, value: critical, share: 0}", "t.yaml:4: reserve share must be a number between 0 and 1 (exclusive)"},
		{"{entry: priority, value: [a], share: 0.5}", "t.yaml:4: reserve value must be a string"},
		{"{entry: priority, share: 0.5}", "t.yaml:4: reserve needs entry, value and share (e.g. {entry: priority, value: critical, share: 0.8}; missing: value)"},
		{"{share: 0.5}", "missing: entry, value)"},
	} {
		errs := loadErrs(t, doc(c.reserve))
		if len(errs) != 1 || !strings.Contains(errs[0], c.want) {
			t.Errorf("%s: errors %q, want exactly one containing %q", c.reserve, errs, c.want)
		}
	}
	errs := loadErrs(t, doc("{entry: priority, share: 2}"))
	if len(errs) != 2 || !strings.Contains(errs[0], "reserve share must be") || !strings.Contains(errs[1], "missing: value)") {
		t.Errorf("errors %q, want the invalid share and the missing value", errs)
	}
}

// TestReserveZeroFloorWarning: a share that floors a limit to 0 for
// non-critical requests is a load warning at the reserve line; a share
// that leaves at least 1 is not.
func TestReserveZeroFloorWarning(t *testing.T) {
	doc := func(share string, rpu int) string {
		return "domain: d\ndescriptors:\n  - key: r\n    reserve: {entry: priority, value: critical, share: " + share + "}\n    rate_limits:\n      - {unit: second, requests_per_unit: 1000}\n      - {unit: minute, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
	}
	_, warns, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(doc("0.01", 5))})
	if err != nil {
		t.Fatalf("LoadSources: %v", err)
	}
	if len(warns) != 1 || warns[0].Line != 4 || !strings.Contains(warns[0].Message, "gives other requests a limit of 0") || !strings.Contains(warns[0].Message, "at least 0.2") {
		t.Errorf("warnings %+v, want one at line 4 about a limit of 0 suggesting share 0.2", warns)
	}
	for _, c := range []struct {
		share string
		rpu   int
	}{{"0.2", 5}, {"0.01", 100}, {"0.5", 2}} {
		_, warns, err := LoadSources(LoadOptions{}, Source{Name: "t.yaml", Data: []byte(doc(c.share, c.rpu))})
		if err != nil || len(warns) != 0 {
			t.Errorf("share %s of %d: warnings %+v, error %v; want none", c.share, c.rpu, warns, err)
		}
	}
}

// TestCGNATOneError: a multiplier out of range is reported once; the
// overflow check does not run with the default in its place.
func TestCGNATOneError(t *testing.T) {
	for _, c := range []struct{ cgnat, want string }{
		{"{multiplier: 1000000000000}", "t.yaml:4: cgnat multiplier"},
		{"{multiplier: 1}", "t.yaml:4: cgnat multiplier must be at least 2"},
		{"{multiplier: 10, ranges: [100.64.0.0/40]}", "t.yaml:4: value \"100.64.0.0/40\" is not a valid CIDR prefix"},
	} {
		errs := loadErrs(t, "domain: d\ndescriptors:\n  - key: ip\n    cgnat: "+c.cgnat+"\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n")
		if len(errs) != 1 || !strings.Contains(errs[0], c.want) {
			t.Errorf("%s: errors %q, want exactly one containing %q", c.cgnat, errs, c.want)
		}
	}
}
