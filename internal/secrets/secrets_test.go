package secrets

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadFile: ReadFile returns the one line of a secret file without its
// newline and refuses an empty, multi-line, oversized or missing file with
// an error that names the flag and never holds the content.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for content, want := range map[string]string{"tok-1\n": "tok-1", "tok-2\r\n": "tok-2", "tok-3": "tok-3"} {
		if got, err := ReadFile("debug-token-file", write("ok", content)); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", content, got, err, want)
		}
	}
	for name, content := range map[string]string{
		"empty": "\n", "two": "Pw-One\nPw-Two\n", "big": strings.Repeat("Pw-", maxFileBytes/3+1),
	} {
		_, err := ReadFile("debug-token-file", write(name, content))
		if err == nil || !strings.HasPrefix(err.Error(), "--debug-token-file: ") || strings.Contains(err.Error(), "Pw-") {
			t.Errorf("%s: %v, want an error naming the flag without the content", name, err)
		}
	}
	if _, err := ReadFile("debug-token-file", filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
}

// TestScrubErr: ScrubErr replaces every secret in the text and keeps the
// error for errors.Is; an error without a secret is returned as is.
func TestScrubErr(t *testing.T) {
	base := errors.New("dial redis://u:pw-123@h:6379: refused")
	err := ScrubErr(base, "pw-123", "")
	if err.Error() != "dial redis://u:xxxxx@h:6379: refused" || !errors.Is(err, base) {
		t.Errorf("scrubbed: %q (is base: %v)", err, errors.Is(err, base))
	}
	if got := ScrubErr(base, "other"); got != base {
		t.Errorf("nothing to scrub: got %v, want the error itself", got)
	}
	if ScrubErr(nil, "pw-123") != nil {
		t.Error("ScrubErr(nil) != nil")
	}
}

// TestRedactArgsKinds: RedactArgs redacts the values of the flags kindOf
// declares secret, in every form the flag package accepts, and nothing
// after "--".
func TestRedactArgsKinds(t *testing.T) {
	kindOf := func(name string) Kind {
		return map[string]Kind{"auth": Whole, "hdr": Headers, "addrs": Address}[name]
	}
	in := []string{"rl", "--auth=u:pw-1", "-auth", "pw-2", "--hdr", "authorization:Bearer tk-3", "--addrs=h1:1,u:pw-4@h2:2", "--name=keep", "--", "--auth=after"}
	got := strings.Join(RedactArgs(in, kindOf), " ")
	for _, secret := range []string{"pw-1", "pw-2", "tk-3", "pw-4"} {
		if strings.Contains(got, secret) {
			t.Errorf("%q holds %s", got, secret)
		}
	}
	for _, want := range []string{"--auth=xxxxx", "-auth xxxxx", "--hdr authorization:xxxxx", "h1:1,", "--name=keep", "-- --auth=after"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
