package service

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// DefaultMaxJSONBodyBytes is the default bound of a /json request body
// (Options.MaxJSONBodyBytes), 1 MiB.
const DefaultMaxJSONBodyBytes = 1 << 20

// JSONHandler serves POST /json, the HTTP twin of ShouldRateLimit: a
// protojson RateLimitRequest in, a protojson RateLimitResponse out. Status:
// 200 for OK, 429 for OVER_LIMIT, 400 for a bad or invalid request, 413 for
// a body over Options.MaxJSONBodyBytes, 503 before the first config, 405
// for other methods. The response's response_headers_to_add are also set as
// HTTP headers, except Content-Type.
func (s *Service) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "service: /json accepts POST only", http.StatusMethodNotAllowed)
			return
		}
		limit := int64(s.opts.MaxJSONBodyBytes)
		if r.ContentLength > limit {
			http.Error(w, fmt.Sprintf("service: request body of %d bytes is larger than the bound of %d", r.ContentLength, limit), http.StatusRequestEntityTooLarge)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, fmt.Sprintf("service: request body larger than the bound of %d bytes", limit), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "service: read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		req := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(body, req); err != nil {
			http.Error(w, "service: bad RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), req)
		if err != nil {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument, codes.Unknown:
				// Unknown: a request refused as envoyproxy/ratelimit
				// refuses it (referenceAnswers), which answers
				// 400 on /json.
				code = http.StatusBadRequest
			case codes.Unavailable:
				code = http.StatusServiceUnavailable
			case codes.DeadlineExceeded:
				code = http.StatusGatewayTimeout
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "service: marshal response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		for _, hv := range resp.GetResponseHeadersToAdd() {
			if strings.EqualFold(hv.GetKey(), HeaderContentType) {
				continue
			}
			h.Add(hv.GetKey(), hv.GetValue())
		}
		h.Set("Content-Type", "application/json")
		code := http.StatusOK
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			code = http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		_, _ = w.Write(out)
	})
}
