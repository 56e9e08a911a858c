package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// remoteListener makes every accepted connection look remote at both
// ends (as a connection to the pod IP does), to exercise the debug
// listener's token rule over real TCP.
type remoteListener struct{ net.Listener }

type remoteConn struct{ net.Conn }

func (l remoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return remoteConn{c}, nil
}
func (c remoteConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 6070} }
func (c remoteConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, 9, 9, 9), Port: 40000}
}

// adminEnv is a service on a one-rule config (user: 3 per hour) over
// the store serveopts.NewStore builds from o, with its debug listener served on a
// real loopback port exactly as serve wires it.
type adminEnv struct {
	svc  *service.Service
	addr string
	log  *testproc.Buffer
	reg  *prometheus.Registry
}

func startAdmin(t *testing.T, o serveopts.Options, remote bool) *adminEnv {
	t.Helper()
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "login.yaml"), "domain: login\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	store, fallback, closeStore, err := serveopts.NewStore(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeStore() })
	e := &adminEnv{log: &testproc.Buffer{}, reg: prometheus.NewRegistry()}
	log := slog.New(slog.NewJSONHandler(e.log, nil))
	al, _ := store.(service.AlgorithmLister)
	lo := policy.LoadOptions{Keys: policy.KeyOptions{ClearText: o.KeyValues == "clear"}}
	if al != nil {
		lo.Algorithms, lo.Backend = al.Algorithms(), o.Backend
	}
	set, _, err := policy.Load(lo, dir)
	if err != nil {
		t.Fatal(err)
	}
	e.svc, err = service.New(serveopts.WithDecisionLog(service.Options{Store: store, Fallback: fallback, Logger: log, Registerer: e.reg,
		MaxJSONBodyBytes: o.GRPCMaxRecvMsgSize}, o))
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetPolicy(set)
	s := &server{opts: o, log: log, svc: e.svc, store: store, health: health.NewServer()}
	hs, g, err := s.debugServer()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	if remote {
		ln = remoteListener{ln}
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		g.Stop()
		<-done
	})
	return e
}

func loginRequest(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "login", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}}
}

// post sends req to path on the debug listener and decodes the JSON answer.
func (e *adminEnv) post(t *testing.T, path string, req *rlsv3.RateLimitRequest, token string) (int, map[string]any) {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	hr, _ := http.NewRequest(http.MethodPost, "http://"+e.addr+path, bytes.NewReader(body))
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	m := map[string]any{}
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func (e *adminEnv) dial(t *testing.T, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, o ...grpc.CallOption) error {
			return inv(withBearer(ctx, token), m, req, reply, cc, o...)
		}), grpc.WithStreamInterceptor(func(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, s grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
			return s(withBearer(ctx, token), d, cc, m, o...)
		}))
	}
	c, err := grpc.NewClient("passthrough:///"+e.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// remaining is the remaining units of the first limit of the first
// descriptor in an explanation document.
func remaining(t *testing.T, m map[string]any) float64 {
	t.Helper()
	ds, _ := m["descriptors"].([]any)
	if len(ds) != 1 {
		t.Fatalf("explanation %v", m)
	}
	ls, _ := ds[0].(map[string]any)["limits"].([]any)
	if len(ls) != 1 {
		t.Fatalf("explanation %v", m)
	}
	return ls[0].(map[string]any)["remaining"].(float64)
}

// TestAdminOverDebugListener: explain and reset on the debug listener, over
// HTTP and gRPC, on each backend: explaining consumes nothing; a reset
// gives the whole quota back; the log names the peer and the hashed key,
// never the value.
func TestAdminOverDebugListener(t *testing.T) {
	for _, backend := range []string{"memory", "redis", "memcache"} {
		t.Run(backend, func(t *testing.T) {
			o := serveopts.Defaults()
			o.Backend = backend
			switch backend {
			case "redis":
				o.Redis.URL = redistest.Standalone(t).URL()
				o.Redis.Timeout = 2 * time.Second
			case "memcache":
				o.Memcache.Addrs = []string{memcachetest.Start(t).Addr()}
				o.Memcache.Timeout = 2 * time.Second
			}
			// Stay clear of an hour boundary (the fixed window resets there).
			if now := time.Now(); now.Minute() == 59 && now.Second() >= 50 {
				time.Sleep(time.Until(now.Truncate(time.Hour).Add(time.Hour + time.Second)))
			}
			e := startAdmin(t, o, false)
			ctx := context.Background()
			user := "alice-" + backend
			req := loginRequest(user)
			for range 2 {
				if _, err := e.svc.ShouldRateLimit(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			for range 2 {
				code, m := e.post(t, service.AdminExplainPath, req, "")
				if code != 200 || remaining(t, m) != 1 || m["code"] != "OK" {
					t.Fatalf("explain after 2 hits: %d %v", code, m)
				}
			}
			if resp, _ := e.svc.ShouldRateLimit(ctx, req); resp.GetStatuses()[0].GetLimitRemaining() != 0 {
				t.Fatalf("third hit: %v (explain consumed)", resp)
			}

			conn := e.dial(t, "")
			ex := &structpb.Struct{}
			if err := conn.Invoke(ctx, "/ratelimitd.admin.v1.Admin/Explain", req, ex); err != nil {
				t.Fatal(err)
			}
			exm := ex.AsMap()
			if exm["code"] != "OVER_LIMIT" || remaining(t, exm) != 0 {
				t.Fatalf("gRPC explain when exhausted: %v", exm)
			}
			res := &structpb.Struct{}
			if err := conn.Invoke(ctx, "/ratelimitd.admin.v1.Admin/Reset", req, res); err != nil {
				t.Fatal(err)
			}
			counters, _ := res.AsMap()["counters"].([]any)
			if len(counters) != 1 {
				t.Fatalf("gRPC reset: %v", res.AsMap())
			}
			key := counters[0].(map[string]any)["key"].(string)
			if code, m := e.post(t, service.AdminExplainPath, req, ""); code != 200 || remaining(t, m) != 3 {
				t.Errorf("explain after reset: %d %v", code, m)
			}
			if resp, _ := e.svc.ShouldRateLimit(ctx, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
				t.Errorf("hit after reset: %v", resp)
			}
			// HTTP reset too.
			if code, m := e.post(t, service.AdminResetPath, req, ""); code != 200 || len(m["counters"].([]any)) != 1 {
				t.Errorf("HTTP reset: %d %v", code, m)
			}
			logs := e.log.String()
			if strings.Count(logs, "admin reset: counter deleted") != 2 || !strings.Contains(logs, `"key":"`+key+`"`) || !strings.Contains(logs, `"who":"127.0.0.1:`) {
				t.Errorf("reset log lines:\n%s", logs)
			}
			if strings.Contains(logs, user) || strings.Contains(key, user) {
				t.Errorf("the descriptor value reached the log or the key:\n%s", logs)
			}
			if !hasService(t, conn, service.AdminServiceName) {
				t.Errorf("reflection does not list %s", service.AdminServiceName)
			}
		})
	}
}

func hasService(t *testing.T, conn *grpc.ClientConn, name string) bool {
	t.Helper()
	st, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.CloseSend() }()
	if err := st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		listed = listed || s.GetName() == name
	}
	// grpcurl also needs the file that declares it (and its imports).
	if err := st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: name}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = st.Recv(); err != nil {
		t.Fatal(err)
	}
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("reflection has no file for %s: %v", name, resp.GetErrorResponse())
	}
	return listed
}

// TestAdminNeedsDebugToken: connections that are not loopback at both ends
// need the debug token, for the admin API over HTTP and gRPC alike.
func TestAdminNeedsDebugToken(t *testing.T) {
	o := serveopts.Defaults()
	file := filepath.Join(t.TempDir(), "token")
	writeTestFile(t, file, "s3cret\n")
	o.DebugTokenFile = file
	e := startAdmin(t, o, true)
	req := loginRequest("bob")
	for _, c := range []struct {
		token string
		want  int
	}{{"", 401}, {"wrong", 401}, {"s3cret", 200}} {
		for _, p := range []string{service.AdminExplainPath, service.AdminResetPath} {
			if code, _ := e.post(t, p, req, c.token); code != c.want {
				t.Errorf("%s with token %q: %d, want %d", p, c.token, code, c.want)
			}
		}
	}
	ctx := context.Background()
	out := &structpb.Struct{}
	for _, m := range []string{"Explain", "Reset"} {
		err := e.dial(t, "").Invoke(ctx, "/ratelimitd.admin.v1.Admin/"+m, req, out)
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC %s without token: %v, want Unauthenticated", m, err)
		}
		if err := e.dial(t, "wrong").Invoke(ctx, "/ratelimitd.admin.v1.Admin/"+m, req, out); status.Code(err) != codes.Unauthenticated {
			t.Errorf("gRPC %s with a wrong token: %v, want Unauthenticated", m, err)
		}
		if err := e.dial(t, "s3cret").Invoke(ctx, "/ratelimitd.admin.v1.Admin/"+m, req, out); err != nil {
			t.Errorf("gRPC %s with the token: %v", m, err)
		}
	}
	if !strings.Contains(e.log.String(), `"who":"10.9.9.9:40000"`) {
		t.Errorf("reset log does not name the peer:\n%s", e.log.String())
	}

	// Without a token file, remote connections get 403 / PermissionDenied.
	o.DebugTokenFile = ""
	e = startAdmin(t, o, true)
	if code, _ := e.post(t, service.AdminResetPath, req, ""); code != 403 {
		t.Errorf("no token file: %d, want 403", code)
	}
	if err := e.dial(t, "").Invoke(ctx, "/ratelimitd.admin.v1.Admin/Reset", req, out); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gRPC without token file: %v, want PermissionDenied", err)
	}
}

func withBearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}
