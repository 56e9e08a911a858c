// Command client sends one ShouldRateLimit call to a ratelimitd (or any
// Envoy RLS v3 server) and prints the response as JSON, for trying the
// service without grpcurl:
//
//	go run ./examples/client -domain example remote_address=10.0.0.1
//
// Each argument is one descriptor: comma-separated key=value entries
// ("plan=free,api_key=k1"). Exit status 0 OK, 1 error, 3 OVER_LIMIT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// hitsFlag is -hits: hits_addend is a uint32, so a larger value is
// refused rather than truncated (4294967296 would become 0, a check that
// consumes nothing).
type hitsFlag uint32

func (h *hitsFlag) String() string { return strconv.FormatUint(uint64(*h), 10) }

func (h *hitsFlag) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("%s is out of range (max %d)", s, uint32(math.MaxUint32))
		}
		return fmt.Errorf("%q is not a non-negative integer", s)
	}
	*h = hitsFlag(v)
	return nil
}

func main() {
	addr := flag.String("addr", "localhost:8081", "ratelimitd gRPC address")
	domain := flag.String("domain", "example", "rate limit domain")
	var hits hitsFlag
	flag.Var(&hits, "hits", "request hits_addend, 0 to 4294967295 (0 means 1)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: client [-addr host:port] [-domain d] key=value[,key=value...] ...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(1)
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, HitsAddend: uint32(hits)}
	for _, arg := range flag.Args() {
		d := &rlcommon.RateLimitDescriptor{}
		for _, kv := range strings.Split(arg, ",") {
			k, v, _ := strings.Cut(kv, "=")
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(protojson.MarshalOptions{Multiline: true, Indent: "  "}.Format(resp))
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		os.Exit(3)
	}
}
