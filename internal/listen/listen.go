// Package listen builds and runs the listeners' servers of `ratelimitd
// serve`: the gRPC server's transport options and resource bounds, the HTTP
// servers' bounds (docs/security.md, "Resource bounds"), the debug listener
// (/rlconfig, the admin API over HTTP and gRPC, pprof; docs/admin.md), and
// serving and stopping them together.
package listen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/internal/boundary"
	"github.com/ratelimitd/ratelimitd/internal/secrets"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// GRPC are the gRPC server's resource bounds.
type GRPC struct {
	MaxRecvMsgSize        int           // --grpc-max-recv-msg-size, bytes
	MaxConcurrentStreams  int           // --grpc-max-concurrent-streams per connection
	MaxConnectionAge      time.Duration // --grpc-max-connection-age; 0 = infinity
	MaxConnectionAgeGrace time.Duration // --grpc-max-connection-age-grace; 0 = infinity
}

// HTTP are an HTTP server's time bounds.
type HTTP struct {
	ReadTimeout  time.Duration // --http-read-timeout: request headers and body
	WriteTimeout time.Duration // --http-write-timeout: the response
	IdleTimeout  time.Duration // --http-idle-timeout: a keep-alive connection without a request
}

// Servers are the gRPC server and the HTTP servers of the listeners,
// served together by Serve and stopped together by Stop.
type Servers struct {
	GRPC          *grpc.Server   // serves GRPCListener
	GRPCListener  net.Listener   // the gRPC listener
	HTTP          []*http.Server // HTTP[i] serves HTTPListeners[i]
	HTTPListeners []net.Listener // the HTTP, debug and metrics listeners

	wg sync.WaitGroup
}

// Serve serves every listener, each on its goroutine; a server that fails
// sends its error to fatal. An HTTP server with a TLSConfig serves TLS.
func (s *Servers) Serve(fatal chan<- error) {
	s.wg.Add(1 + len(s.HTTP))
	go func() {
		defer s.wg.Done()
		if err := s.GRPC.Serve(s.GRPCListener); err != nil {
			fatal <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	for i, hs := range s.HTTP {
		go func() {
			defer s.wg.Done()
			serveFn := hs.Serve
			if hs.TLSConfig != nil {
				serveFn = func(l net.Listener) error { return hs.ServeTLS(l, "", "") }
			}
			if err := serveFn(s.HTTPListeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fatal <- fmt.Errorf("http server: %w", err)
			}
		}()
	}
}

// Stop stops accepting and lets in-flight calls finish within grace
// (--shutdown-grace); gRPC calls still running then are cut, HTTP
// connections closed. It returns when Serve's goroutines have ended.
func (s *Servers) Stop(grace time.Duration, log *slog.Logger) {
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	var hwg sync.WaitGroup
	for _, hs := range s.HTTP {
		hwg.Add(1)
		go func() {
			defer hwg.Done()
			if err := hs.Shutdown(graceCtx); err != nil {
				_ = hs.Close()
			}
		}()
	}
	select {
	case <-done:
	case <-graceCtx.Done():
		log.Warn("shutdown grace expired: cutting in-flight gRPC calls")
		s.GRPC.Stop()
		<-done
	}
	hwg.Wait()
	s.wg.Wait()
}

// Debug is the debug listener: /rlconfig, the admin API (HTTP JSON and
// the gRPC service ratelimitd.admin.v1.Admin) and /debug/pprof/, behind
// boundary.DebugGuard. The admin gRPC service is not registered on the
// main gRPC listener: every Envoy that listener admits could read and
// reset every counter, whereas the debug listener admits loopback
// connections and holders of --debug-token-file only.
type Debug struct {
	Service        *service.Service               // answers /rlconfig and the admin API
	Args           []string                       // the command line /debug/pprof/cmdline serves, redacted
	KindOf         func(flag string) secrets.Kind // the secret kind of each flag of Args
	TokenFile      string                         // --debug-token-file; "" admits loopback connections only
	MaxRecvMsgSize int                            // the admin gRPC service's bound (--grpc-max-recv-msg-size)
	HTTP           HTTP                           // the server's bounds (its WriteTimeout is not used)
	Log            *slog.Logger                   // refused requests and /rlconfig errors
}

// Server is the debug listener's server and the admin gRPC server it
// hands HTTP/2 gRPC requests to. Stop the gRPC server after the HTTP
// server.
func (d Debug) Server() (*http.Server, *grpc.Server, error) {
	g, err := d.adminGRPC()
	if err != nil {
		return nil, nil, err
	}
	hs := d.HTTP.Server(boundary.DebugGuard(withGRPC(d.mux(), g), d.TokenFile, d.Log), false)
	hs.Protocols = debugProtocols()
	return hs, g, nil
}

// mux serves /rlconfig, the admin API (/admin/explain, /admin/reset;
// docs/admin.md) and /debug/pprof/ (cmdline with secrets redacted).
func (d Debug) mux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "/rlconfig: compiled rate-limit rules\n"+
			"POST /admin/explain: how a RateLimitRequest (JSON, as POST /json) would be decided now, without consuming\n"+
			"POST /admin/reset: delete the counters of a RateLimitRequest's descriptors\n"+
			"POST /admin/saturation: mark a rule with reserve saturated ({\"domain\", \"rule\", \"for\"})\n"+
			"gRPC ratelimitd.admin.v1.Admin/{Explain,Reset}: the same over HTTP/2 on this port\n"+
			"/debug/pprof/: Go profiles\n")
	})
	m.HandleFunc("/rlconfig", func(w http.ResponseWriter, r *http.Request) {
		set := d.Service.Policy()
		if set == nil {
			http.Error(w, "no rate limit configuration loaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := set.WriteExplain(w); err != nil {
			d.Log.Warn("rlconfig", "err", err)
		}
	})
	admin := d.Service.AdminHandler()
	m.Handle(service.AdminExplainPath, admin)
	m.Handle(service.AdminResetPath, admin)
	m.Handle(service.AdminSaturationPath, admin)
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", secrets.CmdlineHandler(d.Args, d.KindOf))
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return m
}

// adminGRPC is the gRPC server of the admin service, served through the
// debug listener's HTTP handler (HTTP/2 without TLS, as grpc clients
// speak it with insecure credentials), with reflection.
func (d Debug) adminGRPC() (*grpc.Server, error) {
	g := grpc.NewServer(grpc.MaxRecvMsgSize(d.MaxRecvMsgSize))
	if err := d.Service.RegisterAdmin(g); err != nil {
		return nil, err
	}
	reflection.Register(g)
	return g, nil
}

// withGRPC sends gRPC requests (HTTP/2, Content-Type application/grpc)
// to g and everything else to h.
func withGRPC(h http.Handler, g *grpc.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g != nil && r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// debugProtocols lets the debug listener speak HTTP/1.1 and, for the
// admin gRPC service, HTTP/2 with prior knowledge (no TLS).
func debugProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// streamWorkers is the number of goroutines that serve gRPC streams
// (grpc.NumStreamWorkers): a call is handed to an idle worker instead of a
// new goroutine, whose stack would grow (copy) on every call; a call
// arriving while all are busy still gets its own goroutine. It covers the
// calls in flight of a few busy Envoys (each worker costs one idle
// goroutine).
const streamWorkers = 128

// window is the initial HTTP/2 flow-control window of every stream
// and connection, in bytes. Setting it turns off grpc-go's dynamic window
// (BDP estimation), which sends a PING whenever data arrives and none is
// outstanding, i.e. about one per round trip on a busy connection; 1 MiB
// never limits RateLimitRequests (a few hundred bytes each).
const window = 1 << 20

// keepaliveMinTime is the shortest interval between client keepalive
// pings the gRPC server tolerates (keepalive.EnforcementPolicy.MinTime): a
// client pinging more often gets GOAWAY ("too_many_pings") and its
// connection closed. Envoy sends no keepalive pings unless its cluster
// sets connection_keepalive, whose interval is far longer.
const keepaliveMinTime = 10 * time.Second

// ServerOptions are the gRPC server's transport options, chosen for many
// small unary calls on few long-lived connections (Envoy's pattern), and
// its resource bounds (docs/security.md, "Resource bounds"): the message
// size, concurrent streams per connection, a keepalive enforcement policy
// and the connection age and its grace (0: no limit).
func (o GRPC) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(streamWorkers),
		grpc.InitialWindowSize(window),
		grpc.InitialConnWindowSize(window),
		grpc.MaxRecvMsgSize(o.MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(uint32(o.MaxConcurrentStreams)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		// Time and Timeout stay 0: grpc-go's server pings (2 h, 20 s).
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      o.MaxConnectionAge,
			MaxConnectionAgeGrace: o.MaxConnectionAgeGrace,
		}),
	}
}

// LimitConns returns l, or for max > 0 l accepting at most max connections
// at once (--grpc-max-connections): beyond it Accept waits until one
// closes, so a further client's TCP handshake completes in the kernel's
// backlog but its HTTP/2 handshake waits (its calls run into their
// deadlines).
func LimitConns(l net.Listener, max int) net.Listener {
	if max <= 0 {
		return l
	}
	return netutil.LimitListener(l, max)
}

// maxHeaderBytes bounds the request line and headers an HTTP listener
// reads (http.Server.MaxHeaderBytes), 64 KiB: /json, /healthcheck and
// /metrics need none beyond a few standard ones. A larger header section
// gets 431.
const maxHeaderBytes = 64 << 10

// Server returns an HTTP server for h bounded as documented in
// docs/security.md, "Resource bounds": the request headers must arrive
// within --http-read-timeout (ReadHeaderTimeout and ReadTimeout), the
// response be written within --http-write-timeout when write is true
// (false for the debug listener, whose CPU profiles and traces last as
// long as asked), a keep-alive connection is closed after
// --http-idle-timeout without a request, and headers beyond
// maxHeaderBytes are refused.
func (o HTTP) Server(h http.Handler, write bool) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadTimeout,
		ReadTimeout:       o.ReadTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	if write {
		hs.WriteTimeout = o.WriteTimeout
	}
	return hs
}
