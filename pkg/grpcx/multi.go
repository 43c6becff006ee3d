package grpcx

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// multiServiceConfig balances calls round-robin over the addresses whose connection is ready;
// an address that is down is skipped (and reconnected with backoff) until it answers again.
const multiServiceConfig = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// multiSeq makes each DialMulti resolver scheme unique, so connections never share one.
var multiSeq atomic.Uint64

// SplitTargets turns address lists into one list: every argument may hold several
// comma-separated addresses; blanks are trimmed, empty entries and duplicates dropped, order
// kept. SplitTargets("a:1,b:2", "", "b:2 , c:3") is [a:1 b:2 c:3].
func SplitTargets(lists ...string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, t := range strings.Split(l, ",") {
			t = strings.TrimSpace(t)
			if t == "" || seen[t] {
				continue
			}
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// DialMulti creates one client connection over several equivalent servers (e.g. every BBS
// instance: any of them serves any request). Calls are balanced round-robin over the
// addresses that are currently reachable; an address that goes down is skipped and
// reconnected in the background, so a client keeps working while at least one server is up
// (a call in flight on the server that died fails with Unavailable and may be retried).
//
// Each target is a host:port (not a resolver URI). With a single target DialMulti is Dial.
// With TLS, each address is verified against its own host name unless cfg.TLS names a
// server. opts are applied after DialMulti's own options.
func DialMulti(targets []string, cfg ClientConfig, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	targets = SplitTargets(targets...)
	switch len(targets) {
	case 0:
		return nil, errors.New("grpc dial: no target address")
	case 1:
		return Dial(targets[0], cfg, opts...)
	}
	addrs := make([]resolver.Address, 0, len(targets))
	for _, t := range targets {
		host, _, err := net.SplitHostPort(t)
		if err != nil {
			return nil, fmt.Errorf("grpc dial %s: %q is not host:port: %w", strings.Join(targets, ","), t, err)
		}
		addrs = append(addrs, resolver.Address{Addr: t, ServerName: host})
	}
	r := manual.NewBuilderWithScheme(fmt.Sprintf("gavel-multi-%d", multiSeq.Add(1)))
	r.InitialState(resolver.State{Addresses: addrs})
	all := append([]grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(multiServiceConfig),
	}, opts...)
	// The authority is the first server's host:port, as a single-address Dial would send.
	return Dial(r.Scheme()+":///"+targets[0], cfg, all...)
}
