package policy

import (
	"os"
	"testing"
)

// FuzzParse: any file content either loads or yields ConfigErrors; never a
// panic. A loaded Set answers Match and Key for every rule's own path.
func FuzzParse(f *testing.F) {
	for _, p := range []string{"testdata/basic.yaml", "testdata/wildcard.yaml", "testdata/readme.yaml", "testdata/extensions.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("domain: d\ndescriptors: [a, {key: 1}, {key: b, value: '*', share_threshold: yes}]\n"))
	f.Add([]byte("domain: &x d\ndescriptors:\n  - &n {key: a, rate_limit: {unit: second}}\n  - *n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		errs := &errList{}
		fc := parseFile("f.yaml", data, errs, false)
		s := compile([]*fileConfig{fc}, LoadOptions{}, errs)
		if len(errs.errs) > 0 {
			for _, e := range errs.errs {
				if e.Error() == "" {
					t.Fatal("empty error")
				}
			}
			return
		}
		for _, r := range s.rules {
			e := make([]Entry, len(r.nodes))
			for i, n := range r.nodes {
				e[i] = Entry{Key: n.key, Value: n.value}
			}
			m, ok := s.Match(r.Domain, e)
			if ok {
				for i := range m.Rule.Limits {
					if s.Key(m, i) == "" {
						t.Fatal("empty key")
					}
				}
			}
		}
	})
}
