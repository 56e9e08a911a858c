package policy

import "testing"

func TestConsistencyLeased(t *testing.T) {
	dir := writeFiles(t, map[string]string{"a.yaml": head +
		"  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, consistency: leased}\n" +
		"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, consistency: exact}\n" +
		"  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"})
	s, _, err := Load(LoadOptions{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]Consistency{"a": Leased, "b": Exact, "c": Exact} {
		m, ok := s.Match("d", []Entry{{Key: k}})
		if !ok || m.Rule == nil {
			t.Fatalf("%s: no match", k)
		}
		if got := m.Rule.Limits[0].Consistency; got != want {
			t.Errorf("%s: consistency %v, want %v", k, got, want)
		}
	}
}
