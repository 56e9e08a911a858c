package xds

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// TypeURL is the xDS resource type of rate-limit configs:
// ratelimit.config.ratelimit.v3.RateLimitConfig (go-control-plane's
// resource.RateLimitConfigType), the type envoyproxy/ratelimit subscribes
// to and Envoy Gateway serves.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// SourcePrefix starts the policy.Source name of every resource: errors and
// /rlconfig then say "xds:<resource name>:<line>", the line being in the
// resource's YAML form (ToYAML).
const SourcePrefix = "xds:"

// The YAML form of a RateLimitConfig: exactly the keys of a config file
// (docs/config.md), so that a resource is validated as a file is.
type yamlConfig struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlLimit       `yaml:"rate_limit,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
}

type yamlLimit struct {
	Unit            string        `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// ToYAML returns the config file equivalent of c (one YAML document),
// carrying every field of the RateLimitConfig proto and leaving out empty
// values as a hand-written file would. Nothing is checked here, so that a
// bad resource is rejected by policy with the same message as the file
// would be.
func ToYAML(c *rlsconf.RateLimitConfig) ([]byte, error) {
	doc := yamlConfig{Domain: c.GetDomain(), Descriptors: descriptors(c.GetDescriptors())}
	return yaml.Marshal(&doc)
}

func descriptors(ds []*rlsconf.RateLimitDescriptor) []yamlDescriptor {
	if len(ds) == 0 {
		return nil
	}
	out := make([]yamlDescriptor, 0, len(ds))
	for _, d := range ds {
		out = append(out, yamlDescriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      limit(d.GetRateLimit()),
			Descriptors:    descriptors(d.GetDescriptors()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		})
	}
	return out
}

func limit(p *rlsconf.RateLimitPolicy) *yamlLimit {
	if p == nil {
		return nil
	}
	l := &yamlLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
	if u := p.GetUnit(); u != rlsconf.RateLimitUnit_UNKNOWN {
		// SECOND → second; an out-of-range enum number prints as the
		// number and is rejected as an invalid unit.
		l.Unit = strings.ToLower(u.String())
	}
	if rpu := p.GetRequestsPerUnit(); !l.Unlimited || rpu != 0 {
		l.RequestsPerUnit = &rpu
	}
	for _, r := range p.GetReplaces() {
		l.Replaces = append(l.Replaces, yamlReplace{Name: r.GetName()})
	}
	return l
}

// Sources converts the resources of one DiscoveryResponse into
// policy.Sources, sorted by resource name (so the same resources in
// another order load the same config, with the same SourceHash). Each
// resource must be a RateLimitConfig with a name no other resource of the
// response has; the error says which is not. A response without resources
// gives no sources: a config without domains.
func Sources(resources []*anypb.Any) ([]policy.Source, error) {
	type named struct {
		name string
		cfg  *rlsconf.RateLimitConfig
	}
	var errs []error
	list := make([]named, 0, len(resources))
	seen := map[string]bool{}
	for i, r := range resources {
		c := &rlsconf.RateLimitConfig{}
		if r.GetTypeUrl() != TypeURL {
			errs = append(errs, fmt.Errorf("resource %d: type %q, want %s", i, r.GetTypeUrl(), TypeURL))
			continue
		}
		if err := anypb.UnmarshalTo(r, c, proto.UnmarshalOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("resource %d: cannot decode RateLimitConfig: %w", i, err))
			continue
		}
		name := c.GetName()
		if seen[name] {
			errs = append(errs, fmt.Errorf("resource %d: two RateLimitConfig resources named %q", i, name))
			continue
		}
		seen[name] = true
		list = append(list, named{name, c})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b named) int { return strings.Compare(a.name, b.name) })
	out := make([]policy.Source, 0, len(list))
	for _, n := range list {
		data, err := ToYAML(n.cfg)
		if err != nil {
			return nil, fmt.Errorf("RateLimitConfig %q: %w", n.name, err)
		}
		out = append(out, policy.Source{Name: SourcePrefix + n.name, Data: data})
	}
	return out, nil
}

// Load converts the resources of one DiscoveryResponse (Sources) and
// loads them with policy.LoadSources: one resource is one config file, so
// several resources are several domains (or, with
// LoadOptions.MergeDomains, may share one), validated and compiled exactly
// as files are. A non-nil error means no Set: the response must be
// NACKed.
func Load(opts policy.LoadOptions, resources []*anypb.Any) (*policy.Set, []policy.Warning, error) {
	srcs, err := Sources(resources)
	if err != nil {
		return nil, nil, err
	}
	return policy.LoadSources(opts, srcs...)
}
