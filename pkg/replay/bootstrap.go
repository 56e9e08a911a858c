package replay

import (
	"encoding/json"
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"
)

// DecodeBootstrap decodes an Envoy v3 bootstrap written in YAML (or JSON)
// into the go-control-plane Bootstrap proto and runs its generated
// ValidateAll. YAML is converted to JSON and decoded with protojson, which
// rejects unknown fields and resolves every typed_config Any through the
// protobuf registry: an extension type this package does not link in is an
// error, as it would be for Envoy.
func DecodeBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("replay: envoy yaml: %w", err)
	}
	js, err := json.Marshal(jsonable(doc))
	if err != nil {
		return nil, fmt.Errorf("replay: envoy yaml to json: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap invalid: %w", err)
	}
	if err := validateAnys(b.ProtoReflect(), "bootstrap"); err != nil {
		return nil, fmt.Errorf("replay: envoy bootstrap invalid: %w", err)
	}
	return &b, nil
}

// validateAnys runs ValidateAll on the message inside every Any (the
// generated ValidateAll stops at an Any) and recurses into it, so that
// typed_config contents (HTTP connection manager, routes, filters) are
// checked too.
func validateAnys(m protoreflect.Message, path string) error {
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		visit := func(x protoreflect.Message, p string) {
			if a, ok := x.Interface().(*anypb.Any); ok {
				inner, err := a.UnmarshalNew()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", p, err))
					return
				}
				if va, ok := inner.(interface{ ValidateAll() error }); ok {
					if err := va.ValidateAll(); err != nil {
						errs = append(errs, fmt.Errorf("%s (%s): %w", p, a.GetTypeUrl(), err))
					}
				}
				if err := validateAnys(inner.ProtoReflect(), p); err != nil {
					errs = append(errs, err)
				}
				return
			}
			if err := validateAnys(x, p); err != nil {
				errs = append(errs, err)
			}
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				visit(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message(), p)
		}
		return true
	})
	return errors.Join(errs...)
}

// jsonable turns yaml.v3's decoded values into values encoding/json accepts
// (maps with non-string keys are stringified).
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = jsonable(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = jsonable(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = jsonable(x)
		}
		return t
	default:
		return v
	}
}
