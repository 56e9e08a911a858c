package replay

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// LogLine is one parsed line of an access log.
type LogLine struct {
	// Line is the 1-based line number in the file.
	Line int
	// Time is the request's timestamp (Apache %t: when the request was
	// received, with the zone of the log).
	Time time.Time
	// Client is the remote host (%h) as an IP address, IPv4-mapped IPv6
	// unmapped; a host name is a malformed line.
	Client netip.Addr
	// Method is the request line's method token ("GET").
	Method string
	// Target is the request target as logged (path and query; an
	// absolute-form target is cut to its path).
	Target string
	// Proto is the request line's protocol ("HTTP/1.1"); "" when the
	// request line has none (HTTP/0.9 style).
	Proto string
	// Status is the response status code (%>s), 100 to 999.
	Status int
	// Bytes is the response size (%b); 0 when the log shows "-".
	Bytes int64
	// Referer is the Referer header (combined format); see HasRefer.
	Referer string
	// UA is the User-Agent header (combined format); see HasUA.
	UA string
	// HasRefer is false when the log shows "-" for Referer (header
	// absent) or the line has no such field (common log format).
	HasRefer bool
	// HasUA is HasRefer for the User-Agent field.
	HasUA bool
}

// Malformed is a line that could not be parsed.
type Malformed struct {
	// Line is the 1-based line number in the file.
	Line int
	// Reason says what did not parse ("missing [time]").
	Reason string
}

// timeLayout is Apache's %t: [17/May/2015:10:05:03 +0000].
const timeLayout = "02/Jan/2006:15:04:05 -0700"

// maxLineBytes bounds one log line; longer lines are reported malformed.
const maxLineBytes = 64 << 10

// ParseCombined reads an Apache/Nginx combined log:
//
//	client ident user [time] "method target proto" status bytes "referer" "user-agent"
//
// client is an IPv4 or IPv6 address (an IPv6 address may be bracketed).
// Quoted fields honour backslash escapes (\" and \\). bytes may be "-".
// Lines that do not parse are returned as Malformed with their line number
// and never stop the parse; blank lines are ignored. The only error is an
// I/O error of r.
func ParseCombined(r io.Reader) ([]LogLine, []Malformed, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		lines []LogLine
		bad   []Malformed
		n     int
	)
	for {
		raw, err := br.ReadString('\n')
		if len(raw) > 0 {
			n++
			s := strings.TrimRight(raw, "\r\n")
			if strings.TrimSpace(s) != "" {
				if len(s) > maxLineBytes {
					bad = append(bad, Malformed{Line: n, Reason: "line too long"})
				} else if l, perr := ParseCombinedLine(s); perr != nil {
					bad = append(bad, Malformed{Line: n, Reason: perr.Error()})
				} else {
					l.Line = n
					lines = append(lines, l)
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return lines, bad, nil
		}
		if err != nil {
			return lines, bad, fmt.Errorf("replay: read log: %w", err)
		}
	}
}

// ParseCombinedLine parses one combined-format line (see ParseCombined).
// Line is left 0.
func ParseCombinedLine(s string) (LogLine, error) {
	var l LogLine
	p := &scanner{s: s}
	host := p.word()
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	a, err := netip.ParseAddr(host)
	if err != nil {
		return l, fmt.Errorf("client %q is not an IP address", host)
	}
	l.Client = a.Unmap()
	p.word() // ident
	p.word() // authuser
	ts, ok := p.bracketed()
	if !ok {
		return l, errors.New("missing [time]")
	}
	if l.Time, err = time.Parse(timeLayout, ts); err != nil {
		return l, fmt.Errorf("time %q: not dd/Mon/yyyy:hh:mm:ss ±zzzz", ts)
	}
	req, ok := p.quoted()
	if !ok {
		return l, errors.New("missing quoted request line")
	}
	parts := strings.Fields(req)
	if len(parts) < 2 || len(parts) > 3 || !isToken(parts[0]) || !validTarget(parts[1]) {
		return l, fmt.Errorf("request line %q is not \"METHOD target [protocol]\"", truncate(req, 80))
	}
	l.Method, l.Target = parts[0], parts[1]
	if i := strings.Index(l.Target, "://"); i >= 0 { // absolute-form
		rest := l.Target[i+3:]
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			l.Target = rest[j:]
		} else {
			l.Target = "/"
		}
	}
	if len(parts) == 3 {
		l.Proto = parts[2]
	}
	st := p.word()
	if l.Status, err = strconv.Atoi(st); err != nil || l.Status < 100 || l.Status > 999 {
		return l, fmt.Errorf("status %q is not a 3-digit code", st)
	}
	by := p.word()
	if by != "-" {
		if l.Bytes, err = strconv.ParseInt(by, 10, 64); err != nil || l.Bytes < 0 {
			return l, fmt.Errorf("bytes %q is not a number or -", by)
		}
	}
	if ref, ok := p.quoted(); ok {
		if ref != "-" {
			l.Referer, l.HasRefer = ref, true
		}
		if ua, ok := p.quoted(); ok && ua != "-" {
			l.UA, l.HasUA = ua, true
		}
	} else if p.rest() != "" {
		return l, errors.New("referer is not quoted")
	}
	return l, nil
}

// validTarget accepts origin-form ("/..."), asterisk-form and
// absolute-form request targets (RFC 9112 §3.2).
func validTarget(s string) bool {
	return strings.HasPrefix(s, "/") || s == "*" || strings.Contains(s, "://")
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	return s != ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

type scanner struct {
	s string
	i int
}

func (p *scanner) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *scanner) rest() string { p.skipSpace(); return p.s[p.i:] }

func (p *scanner) word() string {
	p.skipSpace()
	j := p.i
	for p.i < len(p.s) && p.s[p.i] != ' ' && p.s[p.i] != '\t' {
		p.i++
	}
	return p.s[j:p.i]
}

func (p *scanner) bracketed() (string, bool) {
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != '[' {
		return "", false
	}
	j := strings.IndexByte(p.s[p.i:], ']')
	if j < 0 {
		return "", false
	}
	v := p.s[p.i+1 : p.i+j]
	p.i += j + 1
	return v, true
}

func (p *scanner) quoted() (string, bool) {
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return "", false
	}
	var b strings.Builder
	for k := p.i + 1; k < len(p.s); k++ {
		c := p.s[k]
		switch {
		case c == '\\' && k+1 < len(p.s):
			k++
			b.WriteByte(p.s[k])
		case c == '"':
			p.i = k + 1
			return b.String(), true
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}
