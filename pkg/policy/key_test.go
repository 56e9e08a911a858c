package policy

import (
	"fmt"
	"strings"
	"testing"
)

const keyConfig = `domain: k
descriptors:
  - key: a
    rate_limits:
      - unit: second
        requests_per_unit: 1
      - unit: minute
        requests_per_unit: 1
    descriptors:
      - key: b
        rate_limit:
          unit: second
          requests_per_unit: 1
  - key: a_b
    rate_limit:
      unit: second
      requests_per_unit: 1
`

func keySets(t testing.TB) []*Set {
	dir := writeFiles(t, map[string]string{"k.yaml": keyConfig})
	return []*Set{
		mustLoad(t, LoadOptions{}, dir),
		mustLoad(t, LoadOptions{Keys: KeyOptions{ClearText: true}}, dir),
	}
}

func TestKeyInjectiveTable(t *testing.T) {
	long := strings.Repeat("x", 100000)
	tuples := [][]Entry{
		ents("a", ""),
		ents("a", "_"),
		ents("a", "b_c"),
		ents("a_b", "c"),
		ents("a", "b", "b", "c"),
		ents("a", "b_b", "b", "c"),
		ents("a", "b", "b", "b_c"),
		ents("a", ":"),
		ents("a", "1:a,"),
		ents("a", "1:a,1:b,"),
		ents("a", "{x}"),
		ents("a", "x\n"),
		ents("a", "x\ny"),
		ents("a", long),
		ents("a", long+"x"),
		ents("a", "", "b", ""),
		ents("a", "", "b", "1:,"),
		ents("a", "2:,"),
	}
	for _, s := range keySets(t) {
		seen := map[string]string{}
		for _, e := range tuples {
			m, ok := s.Match("k", e)
			if !ok {
				t.Fatalf("no match for %q", e)
			}
			for i := range m.Rule.Limits {
				k := s.Key(m, i)
				if k == "" {
					t.Fatalf("empty key")
				}
				desc := strings.Join([]string{string(rune('0' + i)), m.Rule.Path, entryString(e)}, "|")
				if prev, dup := seen[k]; dup {
					t.Errorf("clear=%v: %s and %s share key %q", s.keys.ClearText, prev, desc, k)
				}
				seen[k] = desc
			}
			// Overrides on the same entries: each (rate, unit) its own
			// counter, none a rule's.
			for _, o := range []struct {
				rpu  uint32
				unit Unit
			}{{0, Minute}, {1, Minute}, {10, Minute}, {1000, Minute}, {10, Hour}, {1, Second}, {4294967295, Year}} {
				k := s.Key(s.Override("k", e, o.rpu, o.unit), 0)
				desc := fmt.Sprintf("override %d/%v|%s", o.rpu, o.unit, entryString(e))
				if prev, dup := seen[k]; dup {
					t.Errorf("clear=%v: %s and %s share key %q", s.keys.ClearText, prev, desc, k)
				}
				seen[k] = desc
			}
		}
	}
}

func entryString(e []Entry) string {
	var b strings.Builder
	for _, x := range e {
		b.WriteString(x.Key + "=" + x.Value + ";")
	}
	return b.String()
}

func TestKeyShape(t *testing.T) {
	dir := writeFiles(t, map[string]string{"k.yaml": keyConfig})
	s := mustLoad(t, LoadOptions{Keys: KeyOptions{Prefix: "rl:"}}, dir)
	m, _ := s.Match("k", ents("a", "secret-token-value"))
	k := s.Key(m, 0)
	if !strings.HasPrefix(k, "rl:") || len(k) != 3+22 || strings.Contains(k, "secret") || strings.ContainsAny(k[3:], "{}:+/=") {
		t.Errorf("hashed key %q", k)
	}
	if s.Key(m, 2) != "" || s.Key(m, -1) != "" || s.Key(Match{}, 0) != "" {
		t.Errorf("out of range key not empty")
	}
	c := mustLoad(t, LoadOptions{Keys: KeyOptions{Prefix: "rl:", ClearText: true}}, dir)
	if k := c.Key(m, 0); !strings.HasPrefix(k, "rl:") || !strings.Contains(k, "18:secret-token-value,") {
		t.Errorf("clear key %q", k)
	}
}

// TestKeyIgnoresRequestsPerUnit: a raised limit counts on the same counter
// (a limit change keeps its counts); another unit or algorithm does not.
func TestKeyIgnoresRequestsPerUnit(t *testing.T) {
	cfg := func(rpu, unit, alg string) string {
		return "domain: k\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: " + unit + "\n      requests_per_unit: " + rpu + "\n      algorithm: " + alg + "\n"
	}
	key := func(c string) string {
		s := mustLoad(t, LoadOptions{}, writeFiles(t, map[string]string{"k.yaml": c}))
		m, _ := s.Match("k", ents("a", "v"))
		return s.Key(m, 0)
	}
	base := key(cfg("10", "minute", "fixed_window"))
	if key(cfg("1000", "minute", "fixed_window")) != base {
		t.Errorf("key depends on requests_per_unit")
	}
	if key(cfg("10", "hour", "fixed_window")) == base {
		t.Errorf("key independent of unit")
	}
	if key(cfg("10", "minute", "sliding_window")) == base {
		t.Errorf("key independent of algorithm")
	}
}

// FuzzKeyInjective: two different (domain, unit, requests_per_unit,
// entries) overrides never share a key, in clear text (exact) and hashed
// form; nor does an override share a key with a config rule.
func FuzzKeyInjective(f *testing.F) {
	f.Add("d", "a", "b_c", "", "", uint8(1), "d", "a_b", "c", "", "", uint8(1), uint8(1), uint8(1), uint32(1), uint32(1))
	f.Add("d", "a", "", "b", "", uint8(2), "d", "a", "1:b,", "", "", uint8(1), uint8(1), uint8(1), uint32(1), uint32(1))
	f.Add("d_a", "b", "c", "", "", uint8(1), "d", "a_b", "c", "", "", uint8(1), uint8(2), uint8(2), uint32(1), uint32(1))
	f.Add("d", "k", "v\n", "x", "{}", uint8(2), "d", "k", "v", "\nx", "{}", uint8(2), uint8(3), uint8(3), uint32(1), uint32(1))
	// the same entries and unit, another rate (10/minute and 1000/minute)
	f.Add("d", "k", "v", "", "", uint8(1), "d", "k", "v", "", "", uint8(1), uint8(2), uint8(2), uint32(10), uint32(1000))
	f.Add("d", "k", "v", "", "", uint8(1), "d", "k", "v", "", "", uint8(1), uint8(2), uint8(2), uint32(1), uint32(11))
	f.Add("d", "k", "1", "", "", uint8(1), "d", "k", "", "", "", uint8(1), uint8(2), uint8(2), uint32(1), uint32(11))
	f.Add("k", "a", "v", "", "", uint8(1), "k", "a", "v", "", "", uint8(1), uint8(1), uint8(1), uint32(0), uint32(4294967295))
	clear := &Set{keys: KeyOptions{ClearText: true}}
	hashed := &Set{keys: KeyOptions{Prefix: "p"}}
	rules := keySets(f) // domain k: rules a, a.b, a_b
	f.Fuzz(func(t *testing.T, d1, k1, v1, k2, v2 string, n1 uint8, d2, k3, v3, k4, v4 string, n2, u1, u2 uint8, r1, r2 uint32) {
		e1 := ents(k1, v1, k2, v2)[:n1%3]
		e2 := ents(k3, v3, k4, v4)[:n2%3]
		unit1, unit2 := Unit(u1%7+1), Unit(u2%7+1)
		same := d1 == d2 && unit1 == unit2 && r1 == r2 && len(e1) == len(e2)
		for i := 0; same && i < len(e1); i++ {
			same = e1[i] == e2[i]
		}
		for _, s := range []*Set{clear, hashed} {
			a := s.Key(s.Override(d1, e1, r1, unit1), 0)
			b := s.Key(s.Override(d2, e2, r2, unit2), 0)
			if (a == b) != same {
				t.Fatalf("clear=%v same=%v keys %q %q for (%q %v %d %v) (%q %v %d %v)", s.keys.ClearText, same, a, b, d1, unit1, r1, e1, d2, unit2, r2, e2)
			}
		}
		for _, s := range rules {
			o := s.Key(s.Override("k", e1, r1, unit1), 0)
			m, ok := s.Match("k", e1)
			for i := 0; ok && i < len(m.Rule.Limits); i++ {
				if k := s.Key(m, i); k == o {
					t.Fatalf("clear=%v: override %d/%v and rule %s limit %d share key %q", s.keys.ClearText, r1, unit1, m.Rule.Path, i, k)
				}
			}
		}
	})
}

func BenchmarkKey(b *testing.B) {
	s := keySets(b)[0]
	m, _ := s.Match("k", ents("a", "203.0.113.7", "b", "user-1234567890"))
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Key(m, 0)
	}
}

func BenchmarkMatch(b *testing.B) {
	s := mustLoad(b, LoadOptions{}, "testdata")
	e := ents("nestedWild", "val1", "wild", "goo2")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.Match("wildcard", e); !ok {
			b.Fatal("no match")
		}
	}
}
