// Package boundary holds every listener that can decide or reveal
// something to a boundary at least as strict as the gRPC listener's
// (docs/security.md, "Trust boundaries"): POST /json on the HTTP listener,
// and the debug listener.
package boundary

import (
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// POST /json decides on the same counters as gRPC. When gRPC uses TLS,
// /json is served only on an HTTP listener with the same TLS material
// (--http-tls) and, when gRPC requires client certificates, only to a
// client whose certificate verifies against the same CA and carries the
// same SAN. Otherwise /json answers 403 and says why. The debug listener
// (/rlconfig, /debug/pprof/, the admin API) serves connections that are
// loopback at both ends (kubectl port-forward, a shell in the pod); any
// other connection needs the bearer token of --debug-token-file.

// TLS is the TLS material of the gRPC listener (--grpc-tls-*), which the
// HTTP listener serves too with --http-tls. The zero value is plaintext.
type TLS struct {
	Cert, Key string // certificate and key files; "" = no TLS
	ClientCA  string // client CA file: client certificates required; "" = none
	ClientSAN string // a SAN every client certificate must carry; "" = any
	HTTP      bool   // --http-tls: the HTTP listener serves the same TLS
}

// GRPCConfig is the gRPC listener's TLS config, reloaded when the files
// change (tlsreload).
func (t TLS) GRPCConfig(log *slog.Logger) (*tls.Config, error) {
	r, err := tlsreload.New(t.Cert, t.Key, t.ClientCA, t.ClientSAN, false, log)
	if err != nil {
		return nil, err
	}
	return r.Config(), nil
}

// JSON is where POST /json stands relative to the gRPC listener's
// boundary.
type JSON struct {
	// off: gRPC uses TLS and the HTTP listener does not, so /json is not
	// served.
	off bool
	// clientCert: /json needs a client certificate verified against the
	// gRPC client CA (the handshake asks for one but lets clients without
	// one reach /healthcheck and /metrics); san, when non-empty, must be
	// among its SANs.
	clientCert bool
	san        string
}

// JSONOf derives the /json boundary from the gRPC and HTTP TLS settings.
func JSONOf(t TLS) JSON {
	if t.Cert == "" {
		return JSON{}
	}
	if !t.HTTP {
		return JSON{off: true}
	}
	return JSON{clientCert: t.ClientCA != "", san: t.ClientSAN}
}

// Describe is the startup log's account of the boundary.
func (b JSON) Describe() string {
	switch {
	case b.off:
		return "off: the gRPC listener uses TLS and the HTTP listener does not (--http-tls serves /json under the same TLS)"
	case b.clientCert:
		return "TLS, client certificate required (as gRPC)"
	}
	return "as the gRPC listener"
}

// Guard wraps the /json handler with the boundary: 403 with a JSON error
// body when /json is off or the client lacks the required certificate.
func (b JSON) Guard(h http.Handler) http.Handler {
	if !b.off && !b.clientCert {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case b.off:
			forbid(w, "POST /json is off: the gRPC listener uses TLS and this HTTP listener does not; start ratelimitd with --http-tls to serve /json under gRPC's TLS and client-certificate rules")
			return
		case r.TLS == nil || len(r.TLS.VerifiedChains) == 0:
			forbid(w, "POST /json needs a client certificate signed by the gRPC client CA (--grpc-tls-client-ca), as gRPC does")
			return
		case b.san != "" && !tlsreload.HasSAN(r.TLS.PeerCertificates[0], b.san):
			forbid(w, "POST /json: the client certificate lacks the SAN the gRPC listener requires (--grpc-tls-client-san)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// forbid answers 403 with {"error": msg}, the shape of /json's own errors.
func forbid(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// IsLoopback reports whether addr ("host:port" or a bare host) is a
// loopback IP address (127.0.0.0/8, ::1). Host names are not resolved:
// "localhost" counts, any other name does not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// localRequest reports whether r arrived on a connection that is loopback
// at both ends. The local end matters: a sidecar proxy (Istio's, for one)
// forwards remote clients to the pod IP from a loopback source address
// (127.0.0.6), so a loopback peer alone does not make a request local.
func localRequest(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && IsLoopback(la.String()) && IsLoopback(r.RemoteAddr)
}

// DebugGuard admits local requests (localRequest) to h, and others only
// with "Authorization: Bearer <token>" where token is the content of
// tokenFile (read on every such request, so a rotated Secret takes effect
// at once; compared in constant time). Without a tokenFile, non-local
// requests get 403; with one, a missing or wrong token gets 401.
func DebugGuard(h http.Handler, tokenFile string, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if localRequest(r) {
			h.ServeHTTP(w, r)
			return
		}
		if tokenFile == "" {
			http.Error(w, "debug listener: only loopback connections are served (set --debug-token-file to admit others with a bearer token)", http.StatusForbidden)
			return
		}
		want, err := secrets.ReadFile("debug-token-file", tokenFile)
		if err != nil {
			log.Error("debug listener: token file unreadable; refusing non-loopback requests", "err", err.Error())
			http.Error(w, "debug listener: token unavailable", http.StatusServiceUnavailable)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(want)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimitd-debug"`)
			http.Error(w, "debug listener: bearer token required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// HTTPConfig is the HTTP listener's TLS config with --http-tls: the gRPC
// listener's certificate (reloaded as gRPC's is), HTTP/2 and HTTP/1.1, and,
// when gRPC requires client certificates, a request for one that is
// verified when given but not required, so that probes and Prometheus
// reach /healthcheck and /metrics without one (JSON.Guard then requires
// it for /json).
func (t TLS) HTTPConfig(log *slog.Logger) (*tls.Config, error) {
	r, err := tlsreload.New(t.Cert, t.Key, t.ClientCA, t.ClientSAN, true, log)
	if err != nil {
		return nil, err
	}
	return r.Config(), nil
}
