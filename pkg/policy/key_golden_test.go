package policy

import "testing"

// goldenConfig covers every shape of key the config can produce: exact,
// value-less, nested, wildcard and share_threshold levels, every
// algorithm, a unit multiplier, calendar windows, several limits on one
// node, a CIDR value, and ipv6_prefix, cgnat (the raised counter) and
// reserve (critical and other requests on one counter).
const goldenConfig = `domain: golden
descriptors:
  - key: plain
    value: v
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: bare
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: outer
    value: o
    descriptors:
      - key: inner
        rate_limit: {unit: hour, requests_per_unit: 100}
      - key: wild
        value: "pre*"
        rate_limit: {unit: day, requests_per_unit: 7}
      - key: shared
        value: "s*"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: algo
    value: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: algo
    value: sliding_log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
  - key: algo
    value: token_bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: algo
    value: concurrency
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: concurrency}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 20}
      - {unit: month, requests_per_unit: 1000, calendar: true}
      - {unit: year, unit_multiplier: 2, requests_per_unit: 5000, calendar: true, algorithm: sliding_window}
  - key: addr
    value: 10.0.0.0/8
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: addr
    ipv6_prefix: 64
    cgnat: {multiplier: 10}
    reserve: {entry: priority, value: critical, share: 0.5}
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// goldenKey is one pinned key: the request entries, the limit index, and
// the key with each KeyOptions of goldenOptions.
type goldenKey struct {
	entries []Entry
	limit   int
	keys    [3]string // hashed, hashed with prefix "rl:", clear text with prefix "rl:"
}

var goldenOptions = [3]KeyOptions{{}, {Prefix: "rl:"}, {Prefix: "rl:", ClearText: true}}

// goldenKeys pins the key of every config shape. These strings are the
// counters of running deployments: a change to any of them resets every
// such counter on upgrade. Never edit them to make a test pass; a new key
// format needs a new version tag ("rl1") and a migration note.
var goldenKeys = []goldenKey{
	{ents("plain", "v"), 0, [3]string{
		"_JalEdyc7CC3s9s5oWoN3Q",
		"rl:_JalEdyc7CC3s9s5oWoN3Q",
		"rl:3:rl1,6:golden,4:rule,1:1,5:plain,1:=,1:v,1:0,12:fixed_window,8:MINUTEx1,1:1,5:plain,1:v,",
	}},
	{ents("bare", "anything"), 0, [3]string{
		"K5KJHN-0zcscJME2AiwPCg",
		"rl:K5KJHN-0zcscJME2AiwPCg",
		"rl:3:rl1,6:golden,4:rule,1:1,4:bare,1:-,0:,1:0,12:fixed_window,8:SECONDx1,1:1,4:bare,8:anything,",
	}},
	{ents("bare", ""), 0, [3]string{
		"d749CFbDnWNoWIzu8lKCdw",
		"rl:d749CFbDnWNoWIzu8lKCdw",
		"rl:3:rl1,6:golden,4:rule,1:1,4:bare,1:-,0:,1:0,12:fixed_window,8:SECONDx1,1:1,4:bare,0:,",
	}},
	{ents("outer", "o", "inner", "x"), 0, [3]string{
		"BJD8-II8G7-AwEi40wUeAQ",
		"rl:BJD8-II8G7-AwEi40wUeAQ",
		"rl:3:rl1,6:golden,4:rule,1:2,5:outer,1:=,1:o,5:inner,1:-,0:,1:0,12:fixed_window,6:HOURx1,1:2,5:outer,1:o,5:inner,1:x,",
	}},
	{ents("outer", "o", "wild", "prefix"), 0, [3]string{
		"AQDMcE4PgzLoX3LsWhKpBQ",
		"rl:AQDMcE4PgzLoX3LsWhKpBQ",
		"rl:3:rl1,6:golden,4:rule,1:2,5:outer,1:=,1:o,4:wild,1:*,4:pre*,1:0,12:fixed_window,5:DAYx1,1:2,5:outer,1:o,4:wild,6:prefix,",
	}},
	{ents("outer", "o", "shared", "s1"), 0, [3]string{
		"KBE5JDXhEdt6Hp-MmbwgUg",
		"rl:KBE5JDXhEdt6Hp-MmbwgUg",
		"rl:3:rl1,6:golden,4:rule,1:2,5:outer,1:=,1:o,6:shared,1:*,2:s*,1:0,12:fixed_window,8:MINUTEx1,1:2,5:outer,1:o,6:shared,2:s*,",
	}},
	{ents("algo", "sliding_window"), 0, [3]string{
		"I1PXd05W_amv633JhA4PgA",
		"rl:I1PXd05W_amv633JhA4PgA",
		"rl:3:rl1,6:golden,4:rule,1:1,4:algo,1:=,14:sliding_window,1:0,14:sliding_window,8:MINUTEx1,1:1,4:algo,14:sliding_window,",
	}},
	{ents("algo", "sliding_log"), 0, [3]string{
		"fjLbJ_hPq7B2LhzjoQJfRw",
		"rl:fjLbJ_hPq7B2LhzjoQJfRw",
		"rl:3:rl1,6:golden,4:rule,1:1,4:algo,1:=,11:sliding_log,1:0,11:sliding_log,8:MINUTEx1,1:1,4:algo,11:sliding_log,",
	}},
	{ents("algo", "token_bucket"), 0, [3]string{
		"05SslbZVsJtgPFnD9hhfug",
		"rl:05SslbZVsJtgPFnD9hhfug",
		"rl:3:rl1,6:golden,4:rule,1:1,4:algo,1:=,12:token_bucket,1:0,12:token_bucket,8:SECONDx1,1:1,4:algo,12:token_bucket,",
	}},
	{ents("algo", "concurrency"), 0, [3]string{
		"HMXElRuMU9JALf4ShVAY1A",
		"rl:HMXElRuMU9JALf4ShVAY1A",
		"rl:3:rl1,6:golden,4:rule,1:1,4:algo,1:=,11:concurrency,1:0,11:concurrency,8:MINUTEx5,1:1,4:algo,11:concurrency,",
	}},
	{ents("multi", "m"), 0, [3]string{
		"5O_DUoJQxJ5RTWcINC36cg",
		"rl:5O_DUoJQxJ5RTWcINC36cg",
		"rl:3:rl1,6:golden,4:rule,1:1,5:multi,1:-,0:,1:0,12:fixed_window,8:SECONDx1,1:1,5:multi,1:m,",
	}},
	{ents("multi", "m"), 1, [3]string{
		"HJhNG_5SGUWA4u2HU2s41Q",
		"rl:HJhNG_5SGUWA4u2HU2s41Q",
		"rl:3:rl1,6:golden,4:rule,1:1,5:multi,1:-,0:,1:1,12:fixed_window,11:MONTHx1/cal,1:1,5:multi,1:m,",
	}},
	{ents("multi", "m"), 2, [3]string{
		"VEZ6jzAvU7AMunpLwvcpOQ",
		"rl:VEZ6jzAvU7AMunpLwvcpOQ",
		"rl:3:rl1,6:golden,4:rule,1:1,5:multi,1:-,0:,1:2,14:sliding_window,10:YEARx2/cal,1:1,5:multi,1:m,",
	}},
	// A CIDR value: kind "/", the request address as identity.
	{ents("addr", "10.1.2.3"), 0, [3]string{
		"AazBEpzNPJ_PpvhaCG5pFA",
		"rl:AazBEpzNPJ_PpvhaCG5pFA",
		"rl:3:rl1,6:golden,4:rule,1:1,4:addr,1:/,10:10.0.0.0/8,1:0,12:fixed_window,8:MINUTEx1,1:1,4:addr,8:10.1.2.3,",
	}},
	// ipv6_prefix: the /64 as identity.
	{ents("addr", "2001:db8:1:2::7"), 0, [3]string{
		"wM_NO55XUPPmRNrSdr8Omw",
		"rl:wM_NO55XUPPmRNrSdr8Omw",
		"rl:3:rl1,6:golden,4:rule,1:1,4:addr,1:-,0:,1:0,12:fixed_window,8:MINUTEx1,1:1,4:addr,17:2001:db8:1:2::/64,",
	}},
	// IPv4 on an ipv6_prefix level, not critical under reserve: the
	// rule's own counter.
	{ents("addr", "192.0.2.1"), 0, [3]string{
		"UVPje1mnY1vbrYYWQ5VauA",
		"rl:UVPje1mnY1vbrYYWQ5VauA",
		"rl:3:rl1,6:golden,4:rule,1:1,4:addr,1:-,0:,1:0,12:fixed_window,8:MINUTEx1,1:1,4:addr,9:192.0.2.1,",
	}},
	// The same address, critical: the same counter.
	{ents("addr", "192.0.2.1", "priority", "critical"), 0, [3]string{
		"UVPje1mnY1vbrYYWQ5VauA",
		"rl:UVPje1mnY1vbrYYWQ5VauA",
		"rl:3:rl1,6:golden,4:rule,1:1,4:addr,1:-,0:,1:0,12:fixed_window,8:MINUTEx1,1:1,4:addr,9:192.0.2.1,",
	}},
	// A CGNAT address: the raised counter.
	{ents("addr", "100.64.0.1"), 0, [3]string{
		"8JhIX8Axx3xumHmlTCIvmw",
		"rl:8JhIX8Axx3xumHmlTCIvmw",
		"rl:3:rl1,6:golden,4:rule,1:1,4:addr,1:-,0:,1:0,12:fixed_window,8:MINUTEx1,5:cgnat,2:10,1:1,4:addr,10:100.64.0.1,",
	}},
}

// TestKeyGolden: config rule keys do not change between releases.
func TestKeyGolden(t *testing.T) {
	dir := writeFiles(t, map[string]string{"g.yaml": goldenConfig})
	var sets [3]*Set
	for i, o := range goldenOptions {
		sets[i] = mustLoad(t, LoadOptions{Keys: o}, dir)
	}
	for _, g := range goldenKeys {
		for i, s := range sets {
			m, ok := s.Match("golden", g.entries)
			if !ok {
				t.Fatalf("%v: no match", g.entries)
			}
			if got := s.Key(m, g.limit); got != g.keys[i] {
				t.Errorf("%v limit %d %+v: key %q, pinned %q", g.entries, g.limit, goldenOptions[i], got, g.keys[i])
			}
		}
	}
}

// goldenOverrides pins request override keys (Set.Override): entries
// plain=v, user=u1 with the given rate and unit.
var goldenOverrides = []struct {
	rpu  uint32
	unit Unit
	keys [3]string
}{
	{10, Minute, [3]string{
		"st4In76ARsZF-Lg-cRXvAQ",
		"rl:st4In76ARsZF-Lg-cRXvAQ",
		"rl:3:rl1,6:golden,8:override,1:0,12:fixed_window,8:MINUTEx1,2:10,1:2,5:plain,1:v,4:user,2:u1,",
	}},
	{1000, Minute, [3]string{
		"e_2rV0PKuUBgTVISCRJHKg",
		"rl:e_2rV0PKuUBgTVISCRJHKg",
		"rl:3:rl1,6:golden,8:override,1:0,12:fixed_window,8:MINUTEx1,4:1000,1:2,5:plain,1:v,4:user,2:u1,",
	}},
	{10, Hour, [3]string{
		"kNrsfpoyweoUki6Wy_7WEQ",
		"rl:kNrsfpoyweoUki6Wy_7WEQ",
		"rl:3:rl1,6:golden,8:override,1:0,12:fixed_window,6:HOURx1,2:10,1:2,5:plain,1:v,4:user,2:u1,",
	}},
}

// TestKeyGoldenOverride: request override keys do not change between
// releases either, and carry the override's rate and unit.
func TestKeyGoldenOverride(t *testing.T) {
	dir := writeFiles(t, map[string]string{"g.yaml": goldenConfig})
	for i, o := range goldenOptions {
		s := mustLoad(t, LoadOptions{Keys: o}, dir)
		for _, g := range goldenOverrides {
			if got := s.Key(s.Override("golden", ents("plain", "v", "user", "u1"), g.rpu, g.unit), 0); got != g.keys[i] {
				t.Errorf("override %d/%v %+v: key %q, pinned %q", g.rpu, g.unit, o, got, g.keys[i])
			}
		}
	}
}
