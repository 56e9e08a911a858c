package replay

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/golden"
)

// TestShapesGolden pins every descriptor shape, with its variants, that
// the repository's Envoy configurations can send (Envoy.Shapes with two
// sample values per request-supplied key).
func TestShapesGolden(t *testing.T) {
	files := []string{"testdata/small-envoy.yaml"}
	more, err := filepath.Glob("../../envoy/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, more...)
	sample := func(k string) []string { return []string{k + "-1", k + "-2"} }
	var b strings.Builder
	loaded := 0
	for _, f := range files {
		e, err := LoadEnvoy(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: not replayable\n", filepath.Base(f))
			continue
		}
		loaded++
		fmt.Fprintf(&b, "%s: domain %s\n", filepath.Base(f), e.Domain)
		for _, s := range e.Shapes(sample) {
			fmt.Fprintf(&b, "  %s domain=%s on_stream_done=%t\n", s.ID, s.Domain, s.OnStreamDone)
			for _, v := range s.Variants {
				es := make([]string, len(v))
				for i, en := range v {
					es[i] = en.Key + "=" + en.Value
				}
				fmt.Fprintf(&b, "    %s\n", strings.Join(es, ","))
			}
		}
	}
	if loaded < 2 {
		t.Fatalf("only %d Envoy configs loaded", loaded)
	}
	got := b.String()
	golden.Check(t, filepath.Join("testdata", "shapes.golden"), []byte(got))
}
