package main

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/lease"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The rules of the options the command hands to other packages are those
// packages' (redis.Options.Validate, memcache.Options.Validate,
// service.Options.Validate, xds.Options.Validate,
// telemetry.Options.Validate); validateOwners runs them on the options the
// flags build and reports each error naming the flag of the field it is
// about, by the settings table's owner entries.

// optionFielder is the field errors of the packages' Validate
// (redis.FieldError, memcache.FieldError, service.FieldError,
// xds.FieldError, telemetry.FieldError, rlqs.FieldError,
// lease.FieldError).
type optionFielder interface {
	OptionField() (field, reason string)
}

// ownerFlagErrors is memcache's server-list errors, which are about two
// flags, worded for the command line.
var ownerFlagErrors = map[error]string{
	memcache.ErrNoServer:         "--backend=memcache needs --memcache-addrs or --memcache-srv",
	memcache.ErrTwoServerSources: "--memcache-addrs and --memcache-srv: set one, not both",
}

// validateOwners validates the options o builds for the redis, memcache,
// service, xds, telemetry, rlqs and lease packages. An error about a setting's owner field is worded
// "--flag=value: reason" (at most one per flag) and dropped when the
// setting's backend is not o.Backend (the Redis topology does not matter
// to the memory store); any other error counts only where its package
// applies (a backend under that backend, xds with --config-source=xds).
func (o Options) validateOwners(named map[string]bool) error {
	so, err := serviceOptions(o)
	if err != nil {
		return nil // the flag's own check (oneOf) reports it
	}
	so.Store = noStore{}
	var errs []error
	seen := named
	for _, c := range []struct {
		applies bool // an error about no flag's field counts
		err     error
	}{
		{o.Backend == "redis", redisOptions(o).Validate()},
		{o.Backend == "memcache", memcacheOptions(o).Validate()},
		{true, so.Validate()},
		{o.ConfigSource == "xds", xdsOptionsError(o)},
		{true, telemetryOptions(o).Validate()},
		{true, rlqsOptions(o, noStore{}).Validate()},
		{true, leaseOptions(o, noLeaseStore{}, nil, nil).Validate()},
	} {
		for _, e := range leafErrors(c.err) {
			if msg, ok := ownerFlagErrors[e]; ok {
				e = errors.New(msg)
			}
			var f optionFielder
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
		for _, f := range strings.Split(s.owner, ",") {
			if name, ok := strings.CutPrefix(f, pkg+"."); ok && s.owner != "" {
				reason = regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).ReplaceAllString(reason, "--"+s.name)
			}
		}
	}
	return reason
}

// ownerSetting returns the setting whose owner list holds field.
func ownerSetting(field string) (setting, bool) {
	for _, s := range settings {
		for _, f := range strings.Split(s.owner, ",") {
			if s.owner != "" && f == field {
				return s, true
			}
		}
	}
	return setting{}, false
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
	case *byteSize:
		return p.String()
	}
	return p
}

// noStore stands for the store while the service options are validated
// before any store exists.
type noStore struct{ service.Store }

// noLeaseStore stands for the lease store while the lease options are
// validated before any store exists.
type noLeaseStore struct{ lease.Store }

// serviceOptions maps the flags onto service.Options, without the store,
// fallback, registry, statsd client and logger (serve adds them). It fails
// on an unknown --headers or --counting.
func serviceOptions(o Options) (service.Options, error) {
	headers, err := service.ParseHeaderMode(o.Headers)
	if err != nil {
		return service.Options{}, err
	}
	counting, err := policy.ParseCounting(o.Counting)
	if err != nil {
		return service.Options{}, err
	}
	so := service.Options{
		ShadowMode: o.ShadowMode,
		QuotaMode:  o.QuotaMode,
		Counting:   counting,
		Headers:    headers,
		LegacyHeaderNames: service.LegacyHeaderNames{
			Limit: o.LegacyLimitHeader, Remaining: o.LegacyRemainingHeader, Reset: o.LegacyResetHeader,
		},
		OmitProblem:            !o.ProblemBody,
		ReferenceAnswers:       o.ReferenceAnswers,
		NearLimitRatio:         o.NearLimitRatio,
		RetryJitter:            retryJitter(o.RetryJitter),
		IgnoreRequestOverrides: !o.RequestOverrides,
		DynamicMetadata:        o.DynamicMetadata,
		NearLimitHeader:        o.NearLimitHeader,
		ProblemTypeBase:        o.ProblemTypeBase,
		ProblemDetail:          o.ProblemDetail,
		// The flag's negative values turn detailed labels off; its 0 is
		// refused (Options.Validate).
		DetailedMetricCap:      max(o.DetailedMetricCap, 0),
		DisableDetailedMetrics: o.DetailedMetricCap < 0,
		FailClosedRetryAfter:   o.FailClosedRetryAfter,
		MaxJSONBodyBytes:       o.GRPCMaxRecvMsgSize,
	}
	return withDecisionLog(so, o), nil
}

// memcacheOptions maps the --memcache-* flags onto memcache.Options.
func memcacheOptions(o Options) memcache.Options {
	mo := memcache.DefaultOptions()
	mo.Addrs = o.MemcacheAddrs
	mo.SRV = o.MemcacheSRV
	mo.SRVRefresh = o.MemcacheSRVRefresh
	mo.MaxIdleConns = o.MemcacheMaxIdleConns
	mo.Timeout = o.MemcacheTimeout
	mo.LocalCacheSize = o.LocalCacheSize
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

// leaseOptions are the Leaser's options of o on store.
func leaseOptions(o Options, store lease.Store, reg prometheus.Registerer, log *slog.Logger) lease.Options {
	return lease.Options{Store: store, Interval: o.LeaseInterval, Registerer: reg, Logger: log}
}

// rlqsOptions are the RLQS server's options of o on store.
func rlqsOptions(o Options, store rlqs.Store) rlqs.Options {
	return rlqs.Options{Store: store, Interval: o.RLQSInterval, AbandonAfter: o.RLQSAbandonAfter, Headroom: o.RLQSHeadroom,
		MaxBucketsPerStream: o.RLQSMaxBucketsPerStream, ShadowMode: o.ShadowMode}
}
