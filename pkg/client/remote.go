package client

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// Remote is a Limiter that asks ratelimitd (or any Envoy RLS v3 server)
// with ShouldRateLimit, so that every process calling the upstream shares
// one budget. Configure the limit there, with the margin already taken off.
type Remote struct {
	client      rlsv3.RateLimitServiceClient
	domain      string
	descriptors []*rlcommon.RateLimitDescriptor
	// Timeout bounds one ShouldRateLimit call when the caller's context
	// has no earlier deadline. Default 1 s.
	Timeout time.Duration
}

// NewRemote returns a Remote asking for domain with the given descriptors,
// each a list of key=value entries in order.
func NewRemote(cc grpc.ClientConnInterface, domain string, descriptors ...[][2]string) *Remote {
	r := &Remote{client: rlsv3.NewRateLimitServiceClient(cc), domain: domain, Timeout: time.Second}
	for _, d := range descriptors {
		desc := &rlcommon.RateLimitDescriptor{}
		for _, e := range d {
			desc.Entries = append(desc.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		r.descriptors = append(r.descriptors, desc)
	}
	return r
}

// Take implements Limiter. On OVER_LIMIT the wait is the shortest of the
// denying statuses' duration_until_reset and the Retry-After header the
// server adds, else one second.
func (r *Remote) Take(ctx context.Context, _ time.Time, cost int64) (bool, time.Duration, error) {
	if _, ok := ctx.Deadline(); !ok && r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: r.domain, Descriptors: r.descriptors, HitsAddend: uint32(min(max(cost, 0), 1<<31)),
	})
	if err != nil {
		return false, 0, fmt.Errorf("client: ShouldRateLimit: %w", err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		return true, 0, nil
	}
	wait := time.Duration(0)
	shorter := func(d time.Duration) {
		if d > 0 && (wait == 0 || d < wait) {
			wait = d
		}
	}
	for _, st := range resp.GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && st.GetDurationUntilReset() != nil {
			shorter(st.GetDurationUntilReset().AsDuration())
		}
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "Retry-After") {
			if s, err := strconv.ParseInt(strings.TrimSpace(h.GetValue()), 10, 64); err == nil {
				shorter(time.Duration(s) * time.Second)
			}
		}
	}
	if wait == 0 {
		wait = time.Second
	}
	return false, wait, nil
}
