package service_test

import (
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The descriptor RegisterAdmin builds at run time and the .proto file
// that documents it declare the same service.
func TestAdminDescriptorMatchesProto(t *testing.T) {
	e := newAdminEnv(t, nil, policy.KeyOptions{}, nil)
	g := grpc.NewServer()
	defer g.Stop()
	if err := e.svc.RegisterAdmin(g); err != nil {
		t.Fatal(err)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service.AdminServiceName))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../proto/ratelimitd/admin/v1/admin.proto")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	if !strings.Contains(text, "package ratelimitd.admin.v1;") || !strings.Contains(text, "service Admin {") {
		t.Error("admin.proto does not declare ratelimitd.admin.v1.Admin")
	}
	ms := d.(protoreflect.ServiceDescriptor).Methods()
	if ms.Len() != 2 {
		t.Fatalf("%d methods", ms.Len())
	}
	for i := range ms.Len() {
		m := ms.Get(i)
		line := "rpc " + string(m.Name()) + "(" + string(m.Input().FullName()) + ") returns (" + string(m.Output().FullName()) + ");"
		if !strings.Contains(text, line) {
			t.Errorf("admin.proto lacks %q", line)
		}
	}
	if _, ok := g.GetServiceInfo()[service.AdminServiceName]; !ok {
		t.Error("service not registered")
	}
}
