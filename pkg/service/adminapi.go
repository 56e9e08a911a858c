package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The admin API: Explain and Reset over HTTP (AdminHandler) and gRPC
// (RegisterAdmin). Both take the RateLimitRequest that ShouldRateLimit
// and POST /json take; cmd/ratelimitd serves them on the debug listener
// only, behind its access rule (docs/admin.md).

// Admin HTTP paths (POST, body a protojson RateLimitRequest as for POST
// /json; answer application/json: an Explanation or a ResetResult).
const (
	AdminExplainPath = "/admin/explain"
	AdminResetPath   = "/admin/reset"
	// AdminSaturationPath marks a rule with reserve saturated (POST a
	// SaturationRequest; answer a SaturationResult; see SetSaturation).
	AdminSaturationPath = "/admin/saturation"
)

// AdminServiceName is the gRPC service of RegisterAdmin; its methods are
// Explain and Reset, each taking an envoy.service.ratelimit.v3.RateLimitRequest
// and returning a google.protobuf.Struct (the Explanation or ResetResult
// JSON document). proto/ratelimitd/admin/v1/admin.proto declares it.
const AdminServiceName = "ratelimitd.admin.v1.Admin"

// adminProtoFile is the descriptor path of the admin service.
const adminProtoFile = "ratelimitd/admin/v1/admin.proto"

// AdminHandler serves AdminExplainPath and AdminResetPath. The caller
// named in the reset log line is r.RemoteAddr. Status: 200, 400 for a
// bad body or an invalid request, 404 for a domain the config in force
// lacks, 405 for methods other than POST, 413
// for a body over Options.MaxJSONBodyBytes, 501 when the Store cannot
// reset, 503 before the first config or when the Store failed; errors
// have the body {"error": message}.
func (s *Service) AdminHandler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc(AdminExplainPath, func(w http.ResponseWriter, r *http.Request) {
		req, ok := s.readAdminRequest(w, r)
		if !ok {
			return
		}
		ex, err := s.Explain(r.Context(), req)
		writeAdmin(w, ex, err)
	})
	m.HandleFunc(AdminResetPath, func(w http.ResponseWriter, r *http.Request) {
		req, ok := s.readAdminRequest(w, r)
		if !ok {
			return
		}
		res, err := s.Reset(r.Context(), req, r.RemoteAddr)
		writeAdmin(w, res, err)
	})
	m.HandleFunc(AdminSaturationPath, s.saturationHandler)
	return m
}

func (s *Service) readAdminRequest(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeAdminError(w, http.StatusMethodNotAllowed, r.URL.Path+" accepts POST only")
		return nil, false
	}
	limit := int64(s.opts.MaxJSONBodyBytes)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeAdminError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than the bound of %d bytes", limit))
			return nil, false
		}
		writeAdminError(w, http.StatusBadRequest, "read body: "+err.Error())
		return nil, false
	}
	req := &rlsv3.RateLimitRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		writeAdminError(w, http.StatusBadRequest, "bad RateLimitRequest JSON: "+err.Error())
		return nil, false
	}
	return req, true
}

func writeAdmin(w http.ResponseWriter, v any, err error) {
	if err != nil {
		code := http.StatusInternalServerError
		switch status.Code(err) {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.NotFound:
			code = http.StatusNotFound
		case codes.Unavailable:
			code = http.StatusServiceUnavailable
		case codes.Unimplemented:
			code = http.StatusNotImplemented
		}
		writeAdminError(w, code, status.Convert(err).Message())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeAdminError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// adminServer is the handler type of the admin gRPC service.
type adminServer interface {
	Explain(context.Context, *rlsv3.RateLimitRequest) (*Explanation, error)
	Reset(context.Context, *rlsv3.RateLimitRequest, string) (*ResetResult, error)
}

var _ adminServer = (*Service)(nil)

// toStruct is v's JSON document as a google.protobuf.Struct.
func toStruct(v any) (*structpb.Struct, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "service: marshal: %v", err)
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(b, st); err != nil {
		return nil, status.Errorf(codes.Internal, "service: marshal: %v", err)
	}
	return st, nil
}

func adminUnary(method string, call func(adminServer, context.Context, *rlsv3.RateLimitRequest) (any, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: method,
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := &rlsv3.RateLimitRequest{}
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, r any) (any, error) {
				v, err := call(srv.(adminServer), ctx, r.(*rlsv3.RateLimitRequest))
				if err != nil {
					return nil, err
				}
				return toStruct(v)
			}
			if ic == nil {
				return h(ctx, req)
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + AdminServiceName + "/" + method}, h)
		},
	}
}

var adminDesc = grpc.ServiceDesc{
	ServiceName: AdminServiceName,
	HandlerType: (*adminServer)(nil),
	Methods: []grpc.MethodDesc{
		adminUnary("Explain", func(a adminServer, ctx context.Context, r *rlsv3.RateLimitRequest) (any, error) {
			return a.Explain(ctx, r)
		}),
		adminUnary("Reset", func(a adminServer, ctx context.Context, r *rlsv3.RateLimitRequest) (any, error) {
			who := ""
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
				who = p.Addr.String()
			}
			return a.Reset(ctx, r, who)
		}),
	},
	Metadata: adminProtoFile,
}

var registerAdminDescriptor = sync.OnceValue(func() error {
	if _, err := protoregistry.GlobalFiles.FindFileByPath(adminProtoFile); err == nil {
		return nil
	}
	method := func(name string) *descriptorpb.MethodDescriptorProto {
		return &descriptorpb.MethodDescriptorProto{
			Name:       proto.String(name),
			InputType:  proto.String(".envoy.service.ratelimit.v3.RateLimitRequest"),
			OutputType: proto.String(".google.protobuf.Struct"),
		}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String(adminProtoFile),
		Package:    proto.String("ratelimitd.admin.v1"),
		Dependency: []string{"envoy/service/ratelimit/v3/rls.proto", "google/protobuf/struct.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name:   proto.String("Admin"),
			Method: []*descriptorpb.MethodDescriptorProto{method("Explain"), method("Reset")},
		}},
		Syntax: proto.String("proto3"),
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return err
	}
	return protoregistry.GlobalFiles.RegisterFile(fd)
})

// RegisterAdmin registers the admin gRPC service (AdminServiceName) on g
// and its descriptor in protoregistry.GlobalFiles, so that server
// reflection describes it (grpcurl). Register it only on a server whose
// callers may read and reset every counter: cmd/ratelimitd serves it on
// the debug listener only.
func (s *Service) RegisterAdmin(g *grpc.Server) error {
	if err := registerAdminDescriptor(); err != nil {
		return fmt.Errorf("service: admin descriptor: %w", err)
	}
	g.RegisterService(&adminDesc, s)
	return nil
}
