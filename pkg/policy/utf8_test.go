package policy

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"
)

// TestLoadRefusesNonUTF8: a config file that is not UTF-8 (UTF-16 with its
// byte-order mark, which the YAML decoder would otherwise sniff and decode,
// or a Latin-1 byte) is refused with the file, the line and "not UTF-8",
// not decoded into garbage.
func TestLoadRefusesNonUTF8(t *testing.T) {
	utf16le := []byte{0xFF, 0xFE}
	for _, u := range utf16.Encode([]rune("domain: one\ndescriptors: []\n")) {
		utf16le = append(utf16le, byte(u), byte(u>>8))
	}
	utf16be := []byte{0xFE, 0xFF}
	for _, u := range utf16.Encode([]rune("domain: one\n")) {
		utf16be = append(utf16be, byte(u>>8), byte(u))
	}
	for name, tc := range map[string]struct {
		data string
		line string
	}{
		"utf16le": {string(utf16le), ":1:"},
		"utf16be": {string(utf16be), ":1:"},
		"latin1":  {"domain: one\n# caf\xe9\ndescriptors: []\n", ":2:"},
	} {
		dir := writeFiles(t, map[string]string{"a.yaml": tc.data})
		file := filepath.Join(dir, "a.yaml")
		_, _, err := Load(LoadOptions{}, file)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, file+tc.line) || !strings.Contains(msg, "not UTF-8") {
			t.Errorf("%s: error %q, want %s%s and \"not UTF-8\"", name, msg, file, tc.line)
		}
	}
	// UTF-8 with a byte-order mark is UTF-8.
	dir := writeFiles(t, map[string]string{"a.yaml": "\xef\xbb\xbfdomain: one\n"})
	if _, _, err := Load(LoadOptions{}, dir); err != nil {
		t.Errorf("UTF-8 with a BOM: %v", err)
	}
}
