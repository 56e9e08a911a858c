package replay

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var updateReportGolden = flag.Bool("update-report-golden", false, "rewrite testdata/small-report.* from the replay of testdata/small.log")

// TestReportGolden pins the three renderings (JSON, text, HTML) of the
// replay of testdata/small.log, byte for byte.
func TestReportGolden(t *testing.T) {
	rep := runSmall(t, smallOptions(t))
	for _, f := range []struct {
		ext   string
		write func(*bytes.Buffer) error
	}{
		{"json", func(b *bytes.Buffer) error { return rep.WriteJSON(b) }},
		{"txt", func(b *bytes.Buffer) error { return rep.WriteText(b) }},
		{"html", func(b *bytes.Buffer) error { return rep.WriteHTML(b) }},
	} {
		var got bytes.Buffer
		if err := f.write(&got); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "small-report."+f.ext)
		if *updateReportGolden {
			if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), got.String()); diff != "" {
			t.Errorf("%s differs (-want +got):\n%s", path, diff)
		}
	}
}
