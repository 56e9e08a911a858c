package replay

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestParseCombinedLine: combined and common log lines parse field by field
// (IPv6, absolute-form targets, escapes, time zones); malformed ones are
// refused.
func TestParseCombinedLine(t *testing.T) {
	ok := []struct {
		line   string
		client string
		method string
		target string
		status int
		bytes  int64
		ref    string
		ua     string
		at     string
	}{
		{`198.18.0.216 - - [17/May/2015:10:05:03 +0000] "GET /a.png HTTP/1.1" 200 203023 "http://s/" "Mozilla/5.0 (X)"`,
			"198.18.0.216", "GET", "/a.png", 200, 203023, "http://s/", "Mozilla/5.0 (X)", "2015-05-17T10:05:03Z"},
		{`2001:db8:0:2a3::1f - - [18/May/2015:23:59:59 +0200] "HEAD /?flav=rss HTTP/1.0" 304 - "-" "-"`,
			"2001:db8:0:2a3::1f", "HEAD", "/?flav=rss", 304, 0, "", "", "2015-05-18T21:59:59Z"},
		{`[2001:db8::1] - user [17/May/2015:10:05:03 +0000] "POST http://h.example/x?y HTTP/1.1" 201 5 "r" "say \"hi\" \\o/"`,
			"2001:db8::1", "POST", "/x?y", 201, 5, "r", `say "hi" \o/`, "2015-05-17T10:05:03Z"},
		{`::ffff:192.0.2.1 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1`, // common log format: no referer/UA
			"192.0.2.1", "GET", "/", 200, 1, "", "", "2015-05-17T10:05:03Z"},
	}
	for _, tc := range ok {
		l, err := ParseCombinedLine(tc.line)
		if err != nil {
			t.Errorf("%s: %v", tc.line, err)
			continue
		}
		at, _ := time.Parse(time.RFC3339, tc.at)
		if l.Client != netip.MustParseAddr(tc.client) || l.Method != tc.method || l.Target != tc.target || l.Status != tc.status ||
			l.Bytes != tc.bytes || l.Referer != tc.ref || l.UA != tc.ua || !l.Time.Equal(at) {
			t.Errorf("%s: got %+v", tc.line, l)
		}
	}
	bad := []string{
		`example.com - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "-"`,
		`192.0.2.1 - - [17/May/2015 10:05:03] "GET / HTTP/1.1" 200 1 "-" "-"`,
		`192.0.2.1 - - 17/May/2015:10:05:03 +0000 "GET / HTTP/1.1" 200 1 "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "-" 408 0 "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" abc 1 "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 x "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1 200 1 "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "\x16\x03\x01" 400 0 "-" "-"`,
		`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 - -`,
	}
	for _, s := range bad {
		if l, err := ParseCombinedLine(s); err == nil {
			t.Errorf("accepted %q as %+v", s, l)
		}
	}
}

// TestParseCombinedCountsMalformed: ParseCombined keeps line numbers,
// returns malformed lines apart, skips blank ones and reads a last line
// without a newline.
func TestParseCombinedCountsMalformed(t *testing.T) {
	in := "192.0.2.1 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\r\n" +
		"garbage\n\n" +
		"192.0.2.1 - - [17/May/2015:10:05:04 +0000] \"GET /b HTTP/1.1\" 200 1 \"-\" \"-\"\n" +
		"192.0.2.1 - - [bad] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"" // no final newline
	lines, bad, err := ParseCombined(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].Line != 1 || lines[1].Line != 4 || lines[1].Target != "/b" {
		t.Errorf("lines = %+v", lines)
	}
	if len(bad) != 2 || bad[0].Line != 2 || bad[1].Line != 5 {
		t.Errorf("malformed = %+v", bad)
	}
}

// FuzzParseCombinedLine: a line ParseCombinedLine accepts has valid fields
// and an origin-form target.
func FuzzParseCombinedLine(f *testing.F) {
	f.Add(`198.18.0.216 - - [17/May/2015:10:05:03 +0000] "GET /a.png HTTP/1.1" 200 203023 "http://s/" "Mozilla/5.0 (X)"`)
	f.Add(`[2001:db8::1] - user [17/May/2015:10:05:03 +0000] "POST http://h.example/x?y HTTP/1.1" 201 5 "r" "say \"hi\""`)
	f.Add(`192.0.2.1 - - [17/May/2015:10:05:03 +0000] "-" 408 0 "-" "-"`)
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseCombinedLine(s)
		if err != nil {
			return
		}
		if !l.Client.IsValid() || l.Method == "" || l.Target == "" || l.Status < 100 || l.Status > 999 || l.Bytes < 0 {
			t.Fatalf("accepted %q with invalid fields %+v", s, l)
		}
		if !strings.HasPrefix(l.Target, "/") && l.Target != "*" {
			t.Fatalf("target %q of %q is not origin-form", l.Target, s)
		}
	})
}
