package replay

import (
	"net/netip"
	"net/url"
	"strings"
)

// Request is what a log line tells about one HTTP request, as Envoy's
// rate-limit filter would see it: the filters before it (a header_mutation
// that strips client copies of a header, an ext_authz that adds one) are
// the caller's to reflect; Match applies only the header_mutation filters
// after it.
type Request struct {
	// Client is the downstream address (remote_address).
	Client netip.Addr
	// Method is the request method (:method); "" when unknown, and then
	// :method is absent for header matchers.
	Method string
	// Path is the request target as sent (:path, with query string).
	Path string
	// Headers holds lower-case header names to values (e.g. "user-agent",
	// "referer", ":authority"); only what the log records.
	Headers map[string]string
}

// header returns a request header, including the pseudo-headers :path,
// :method and :authority (alias host).
func (r *Request) header(name string) (string, bool) {
	switch name = strings.ToLower(name); name {
	case ":path":
		return r.Path, true
	case ":method":
		return r.Method, r.Method != ""
	case "host":
		name = ":authority"
	}
	v, ok := r.Headers[name]
	return v, ok
}

func (r *Request) query() url.Values {
	_, q, ok := strings.Cut(r.Path, "?")
	if !ok {
		return nil
	}
	v, _ := url.ParseQuery(q)
	return v
}

func (r *Request) pathNoQuery() string {
	p, _, _ := strings.Cut(r.Path, "?")
	return p
}
