// Command noop is a grpc-go server of envoy.service.ratelimit.v3's
// RateLimitService whose ShouldRateLimit answers OK without looking at the
// request: no matching, no store, no metrics. scripts/bench-compare.sh
// measures it in the same run as ratelimitd, as the floor of the service
// CPU any grpc-go implementation of the API pays per decision (HTTP/2,
// HPACK, protobuf, the scheduler).
//
//	noop --grpc-addr 127.0.0.1:8081 --http-addr 127.0.0.1:8080
//
// GET /healthcheck on --http-addr answers OK once the gRPC listener is open.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// server answers every ShouldRateLimit with OK.
type server struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ok is the one answer, shared: building it per call would be work the
// floor should not include.
var ok = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

// ShouldRateLimit answers OK.
func (server) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return ok, nil
}

// newGRPCServer returns a grpc-go server with defaults and the no-op
// RateLimitService registered.
func newGRPCServer() *grpc.Server {
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, server{})
	return s
}

// healthHandler answers GET /healthcheck with OK.
func healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "OK")
	})
	return mux
}

func main() {
	grpcAddr := flag.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address")
	httpAddr := flag.String("http-addr", "127.0.0.1:8080", "HTTP listen address of GET /healthcheck")
	flag.Parse()
	if err := run(*grpcAddr, *httpAddr); err != nil {
		fmt.Fprintln(os.Stderr, "noop:", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM.
func run(grpcAddr, httpAddr string) error {
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		_ = gl.Close()
		return err
	}
	gs := newGRPCServer()
	hs := &http.Server{Handler: healthHandler()}
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() {
		if err := hs.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err = <-errc:
	}
	gs.Stop()
	_ = hs.Close()
	return err
}
