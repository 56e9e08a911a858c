package serveopts

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/gcpolicy"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/opterr"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry"
)

// The rules of the options the command hands to other packages are those
// packages' (redis, memcache, service, xds, telemetry, rlqs and lease's
// Options.Validate), each error about a field an *opterr.FieldError;
// validateOwners runs them on the options the flags build and reports
// each error naming the flag of the field it is about: the setting bound
// to that field (ownersOf).

// ownerFlagErrors is memcache's server-list errors, which are about two
// flags, worded for the command line.
var ownerFlagErrors = map[error]string{
	memcache.ErrNoServer:         "--backend=memcache needs --memcache-addrs or --memcache-srv",
	memcache.ErrTwoServerSources: "--memcache-addrs and --memcache-srv: set one, not both",
}

// validateOwners validates the options o builds for the packages
// (packageChecks). An error about a setting's owner field is worded
// "--flag=value: reason" (at most one per flag) and dropped when the
// setting's backend is not o.Backend (the Redis topology does not matter
// to the memory store); any other error counts only where its package
// applies (a backend under that backend, xds with --config-source=xds).
func (o Options) validateOwners(named map[string]bool) error {
	checks, ok := packageChecks(o)
	if !ok {
		return nil // the flag's own check (OneOf) reports it
	}
	var errs []error
	seen := named
	for _, c := range checks {
		for _, e := range leafErrors(c.err) {
			if msg, ok := ownerFlagErrors[e]; ok {
				e = errors.New(msg)
			}
			var f *opterr.FieldError
			if !errors.As(e, &f) {
				if c.applies {
					errs = append(errs, e)
				}
				continue
			}
			field, reason := f.OptionField()
			s, ok := ownerSetting(field)
			switch {
			case !ok:
				if c.applies {
					errs = append(errs, e)
				}
			case s.backend != "" && s.backend != o.Backend, seen[s.name]:
			default:
				seen[s.name] = true
				errs = append(errs, fmt.Errorf("%s: %s", flagEquals(s.name, fieldValue(s.field.ptr(&o))), flagWords(field, reason)))
			}
		}
	}
	return errors.Join(errs...)
}

// packageCheck is one package's Validate on the options the flags build
// for it.
type packageCheck struct {
	applies bool  // an error about no flag's field counts
	err     error // the package's Validate
}

// packageChecks validates the options o builds for the redis, memcache,
// service, xds, telemetry, rlqs and lease packages; ok is false when the
// service options cannot be built.
func packageChecks(o Options) (checks []packageCheck, ok bool) {
	so, err := ServiceOptions(o)
	if err != nil {
		return nil, false
	}
	so.Store = noStore{}
	return []packageCheck{
		{o.Backend == "redis", redisOptions(o).Validate()},
		{o.Backend == "memcache", memcacheOptions(o).Validate()},
		{true, so.Validate()},
		{o.ConfigSource == "xds", xdsOptionsError(o)},
		{true, TelemetryOptions(o).Validate()},
		{true, RLQSOptions(o, noStore{}).Validate()},
		{true, LeaseOptions(o, noLeaseStore{}, nil, nil).Validate()},
	}, true
}

// xdsOptionsError is xds.Options.Validate on the --xds-* flags with
// --config-source=xds, nil otherwise (they are not read then).
func xdsOptionsError(o Options) error {
	if o.ConfigSource != "xds" {
		return nil
	}
	return xdsBase(o).Validate()
}

// flagWords rewrites the names of field's package's fields in reason
// ("must be >= BackoffInitial") as their flags ("must be >=
// --xds-backoff-initial").
func flagWords(field, reason string) string {
	pkg, _, _ := strings.Cut(field, ".")
	for _, s := range settings {
		for _, f := range ownersOf(s) {
			if name, ok := strings.CutPrefix(f, pkg+"."); ok {
				reason = regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).ReplaceAllString(reason, "--"+s.name)
			}
		}
	}
	return reason
}

// ownerSetting returns the setting that owns field.
func ownerSetting(field string) (setting, bool) {
	for _, s := range settings {
		if slices.Contains(ownersOf(s), field) {
			return s, true
		}
	}
	return setting{}, false
}

// ownersOf names the package option fields s sets, "redis.Breaker.Window":
// those its binding points into (a package's options held in Options).
func ownersOf(s setting) []string {
	var o Options
	var out []string
	for _, p := range []func(*Options) any{s.field.ptr, s.field.also} {
		if p != nil {
			f := p(&o)
			if b, ok := f.(*notBool); ok {
				f = b.p
			}
			if name, ok := optionField(reflect.ValueOf(&o).Elem(), reflect.ValueOf(f).Pointer()); ok {
				out = append(out, name)
			}
		}
	}
	return out
}

// optionField names the field at addr within one of o's package option
// structs (a field whose type another package declares): its package,
// then the field path ("redis.Breaker.Window").
func optionField(o reflect.Value, addr uintptr) (string, bool) {
	for i := 0; i < o.NumField(); i++ {
		f := o.Field(i)
		if f.Kind() != reflect.Struct || f.Type().PkgPath() == o.Type().PkgPath() {
			continue
		}
		if p, ok := fieldPath(f, addr); ok {
			return path.Base(f.Type().PkgPath()) + "." + p, true
		}
	}
	return "", false
}

// fieldPath is the dotted path of the field of struct v at addr.
func fieldPath(v reflect.Value, addr uintptr) (string, bool) {
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), v.Type().Field(i).Name
		if f.Kind() == reflect.Struct {
			if p, ok := fieldPath(f, addr); ok {
				return name + "." + p, true
			}
		}
		if f.CanAddr() && f.Addr().Pointer() == addr && f.Kind() != reflect.Struct {
			return name, true
		}
	}
	return "", false
}

// leafErrors flattens errors.Join trees.
func leafErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leafErrors(e)...)
		}
		return out
	}
	return []error{err}
}

// fieldValue dereferences a setting's field pointer for messages.
func fieldValue(p any) any {
	switch p := p.(type) {
	case *string:
		return *p
	case *bool:
		return *p
	case *int:
		return *p
	case *int64:
		return *p
	case *float64:
		return *p
	case *time.Duration:
		return *p
	case *[]string:
		return strings.Join(*p, ",")
	case *gcpolicy.ByteSize:
		return p.String()
	case *notBool:
		return !*p.p
	}
	return p
}

// noStore stands for the store while the service options are validated
// before any store exists.
type noStore struct{ service.Store }

// noLeaseStore stands for the lease store while the lease options are
// validated before any store exists.
type noLeaseStore struct{ lease.Store }

// ServiceOptions maps the flags onto service.Options, without the store,
// fallback, registry, statsd client and logger (serve adds them). It fails
// on an unknown --headers or --counting.
func ServiceOptions(o Options) (service.Options, error) {
	headers, err := service.ParseHeaderMode(o.Headers)
	if err != nil {
		return service.Options{}, err
	}
	counting, err := policy.ParseCounting(o.Counting)
	if err != nil {
		return service.Options{}, err
	}
	so := o.Service
	so.Counting, so.Headers = counting, headers
	so.LegacyHeaderNames = service.LegacyHeaderNames{Limit: o.LegacyLimitHeader, Remaining: o.LegacyRemainingHeader, Reset: o.LegacyResetHeader}
	so.OmitProblem = !o.ProblemBody
	so.ReferenceAnswers = o.ReferenceAnswers
	so.RetryJitter = retryJitter(o.RetryJitter)
	so.IgnoreRequestOverrides = !o.RequestOverrides
	// The flag's negative values turn detailed labels off; its 0 is
	// refused (Options.Validate).
	so.DetailedMetricCap, so.DisableDetailedMetrics = max(so.DetailedMetricCap, 0), so.DetailedMetricCap < 0
	so.MaxJSONBodyBytes = o.GRPCMaxRecvMsgSize
	return WithDecisionLog(so, o), nil
}

// memcacheOptions are the memcache.Options the --memcache-* flags set,
// with --local-cache-size.
func memcacheOptions(o Options) memcache.Options {
	mo := o.Memcache
	mo.LocalCacheSize = o.Redis.LocalCacheSize
	return mo
}

// retryJitter maps --retry-jitter onto service.Options.RetryJitter, where 0
// means the default (1s) and a negative value disables jitter: the flag's 0
// means no jitter.
func retryJitter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// LeaseOptions are the Leaser's options of o on store.
func LeaseOptions(o Options, store lease.Store, reg prometheus.Registerer, log *slog.Logger) lease.Options {
	lo := o.Lease
	lo.Store, lo.Registerer, lo.Logger = store, reg, log
	return lo
}

// RLQSOptions are the RLQS server's options of o on store.
func RLQSOptions(o Options, store rlqs.Store) rlqs.Options {
	ro := o.RLQS
	ro.Store, ro.ShadowMode = store, o.Service.ShadowMode
	return ro
}

// TelemetryOptions maps the --tracing-* flags onto telemetry.Options;
// --tracing-sample-ratio=0 samples no root span (telemetry.NeverSample:
// the package's zero SampleRatio is its default, 1), and a negative one
// stays invalid.
func TelemetryOptions(o Options) telemetry.Options {
	to := o.Telemetry
	switch {
	case to.SampleRatio == 0:
		to.SampleRatio = telemetry.NeverSample
	case to.SampleRatio < 0:
		to.SampleRatio = math.NaN() // refused by telemetry.Options.Validate, never NeverSample
	}
	return to
}
