package replay

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/golden"
)

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
		golden.Check(t, filepath.Join("testdata", "small-report."+f.ext), got.Bytes())
	}
}
