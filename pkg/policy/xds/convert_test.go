package xds_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds"
	"github.com/ratelimitd/ratelimitd/pkg/policy/xds/xdstest"
)

func anys(t *testing.T, cs ...*rlsconf.RateLimitConfig) []*anypb.Any {
	t.Helper()
	var out []*anypb.Any
	for _, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// Every field of the proto reaches the YAML form under its config file key.
func TestToYAMLEveryField(t *testing.T) {
	c := &rlsconf.RateLimitConfig{Name: "n", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: "k", Value: "v", ShadowMode: true, DetailedMetric: true,
		RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 7, Name: "weekly",
			Replaces: []*rlsconf.RateLimitReplace{{Name: "other"}}},
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "child", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}}},
	}}}
	got, err := xds.ToYAML(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `domain: d
descriptors:
    - key: k
      value: v
      rate_limit:
        unit: week
        requests_per_unit: 7
        name: weekly
        replaces:
            - name: other
      descriptors:
        - key: child
          rate_limit:
            unlimited: true
      shadow_mode: true
      detailed_metric: true
`
	if string(got) != want {
		t.Errorf("ToYAML:\n%s\nwant:\n%s", got, want)
	}
}

// A resource loads as the same document in a file does: the same rules,
// limits and flags, and the same validation messages.
func TestSameAsFile(t *testing.T) {
	cfgs := xdstest.EGConfigs(2)
	cfgs[0].Descriptors[0].Descriptors[0].ShadowMode = true
	xset, _, err := xds.Load(policy.LoadOptions{}, anys(t, cfgs...))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, c := range cfgs {
		y, err := xds.ToYAML(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, string(rune('a'+i))+".yaml"), y, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fset, _, err := policy.Load(policy.LoadOptions{}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(xset.Rules()) != len(fset.Rules()) || len(xset.Rules()) != 5 {
		t.Fatalf("%d rules from xDS, %d from files, want 5", len(xset.Rules()), len(fset.Rules()))
	}
	byPath := map[string]*policy.Rule{}
	for _, r := range fset.Rules() {
		byPath[r.Domain+" "+r.Path] = r
	}
	for _, r := range xset.Rules() {
		f := byPath[r.Domain+" "+r.Path]
		if f == nil {
			t.Errorf("xDS rule %s %s has no file twin", r.Domain, r.Path)
			continue
		}
		if r.Limits[0].RequestsPerUnit != f.Limits[0].RequestsPerUnit || r.Limits[0].Unit != f.Limits[0].Unit || r.ShadowMode != f.ShadowMode {
			t.Errorf("%s: xDS %+v, file %+v", r.Path, r.Limits[0], f.Limits[0])
		}
		if !strings.HasPrefix(r.File, xds.SourcePrefix) {
			t.Errorf("rule file %q, want %s<name>", r.File, xds.SourcePrefix)
		}
	}
	if !xset.Rules()[0].ShadowMode {
		t.Errorf("shadow_mode of %s lost", xset.Rules()[0].Path)
	}

	// The same invalid document: the same messages, file names aside.
	bad := &rlsconf.RateLimitConfig{Name: "bad", Domain: "bad", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1}},
		{Key: "u", RateLimit: &rlsconf.RateLimitPolicy{Unit: 42, RequestsPerUnit: 1}},
		{Key: "r", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, Name: "self", Replaces: []*rlsconf.RateLimitReplace{{Name: "self"}}}},
	}}
	_, _, xerr := xds.Load(policy.LoadOptions{}, anys(t, bad))
	y, _ := xds.ToYAML(bad)
	file := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(file, y, 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, ferr := policy.Load(policy.LoadOptions{}, file)
	if xerr == nil || ferr == nil {
		t.Fatalf("errors: xDS %v, file %v", xerr, ferr)
	}
	if got, want := strings.ReplaceAll(xerr.Error(), "xds:bad", "F"), strings.ReplaceAll(ferr.Error(), file, "F"); got != want {
		t.Errorf("xDS errors:\n%s\nfile errors:\n%s", got, want)
	}
	for _, w := range []string{"empty key", "invalid rate limit unit \"42\"", "cannot replace itself"} {
		if !strings.Contains(xerr.Error(), w) {
			t.Errorf("errors lack %q:\n%v", w, xerr)
		}
	}
}

func TestSourcesOrderAndHash(t *testing.T) {
	cfgs := xdstest.EGConfigs(1)
	a, _, err := xds.Load(policy.LoadOptions{}, anys(t, cfgs[0], cfgs[1]))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := xds.Load(policy.LoadOptions{}, anys(t, cfgs[1], cfgs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if a.SourceHash() != b.SourceHash() {
		t.Error("the same resources in another order have another SourceHash")
	}
	c, _, err := xds.Load(policy.LoadOptions{}, anys(t, xdstest.EGConfigs(2)...))
	if err != nil {
		t.Fatal(err)
	}
	if c.SourceHash() == a.SourceHash() {
		t.Error("changed limits, same SourceHash")
	}
	empty, warns, err := xds.Load(policy.LoadOptions{}, nil)
	if err != nil || len(empty.Domains()) != 0 || len(warns) != 1 || !strings.Contains(warns[0].Message, "no rate-limit domains") {
		t.Errorf("no resources: %v domains, warnings %v, err %v", empty.Domains(), warns, err)
	}
}

func TestSourcesErrors(t *testing.T) {
	c := xdstest.EGConfigs(1)[0]
	other, _ := anypb.New(&rlsconf.RateLimitPolicy{})
	broken := anys(t, c)[0]
	broken.Value = []byte{0xff, 0xff}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"other type", []*anypb.Any{other}, "want " + xds.TypeURL},
		{"undecodable", []*anypb.Any{broken}, "cannot decode"},
		{"same name twice", anys(t, c, proto.Clone(c).(*rlsconf.RateLimitConfig)), "two RateLimitConfig resources named"},
		{"too large", anys(t, c), "--max-config-bytes"},
		{"empty domain", anys(t, &rlsconf.RateLimitConfig{Name: "x"}), "empty domain"},
	} {
		opts := policy.LoadOptions{}
		if tc.name == "too large" {
			opts.MaxBytes = 10
		}
		if _, _, err := xds.Load(opts, tc.res); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	// MaxRules applies as to files.
	if _, _, err := xds.Load(policy.LoadOptions{MaxRules: 2}, anys(t, xdstest.EGConfigs(1)...)); err == nil || !strings.Contains(err.Error(), "--max-config-rules") {
		t.Errorf("MaxRules: %v", err)
	}
}
