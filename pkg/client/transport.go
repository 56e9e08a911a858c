package client

import (
	"net/http"
	"strconv"
)

// Transport is an http.RoundTripper that paces every request through a
// Pacer and feeds every response back to it.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Pacer paces them; required.
	Pacer *Pacer
	// Cost returns a request's cost in units; nil means 1.
	Cost func(*http.Request) int64
}

// RoundTrip implements http.RoundTripper. A request whose context ends
// while it waits is not sent and returns the context's error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	cost := int64(1)
	if t.Cost != nil {
		cost = t.Cost(req)
	}
	tk, err := t.Pacer.wait(req.Context(), cost)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // RoundTrip must close the body, even on errors
		}
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err != nil {
		t.Pacer.Done()
		return nil, err
	}
	t.Pacer.observe(tk, resp.StatusCode, resp.Header)
	return resp, nil
}

// CostHeader returns a Cost function reading a request header as an integer
// (a token count, for example); missing or malformed means 1.
func CostHeader(name string) func(*http.Request) int64 {
	return func(r *http.Request) int64 {
		if n, err := strconv.ParseInt(r.Header.Get(name), 10, 64); err == nil && n >= 0 {
			return n
		}
		return 1
	}
}
