// Package api is the auctioneer's gRPC handler: it validates auction requests, refuses them
// while this auctioneer is a standby, and queues them for the next auction round.
package api

import (
	"context"

	auctioneerv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/auction"
	"github.com/gavel-sched/gavel/services/auctioneer/internal/placement"
)

// ErrNotLeader is the message a standby answers with (as FAILED_PRECONDITION).
const ErrNotLeader = "not the leader"

// Queue takes work for the next auction round.
type Queue interface {
	// Leading reports whether this auctioneer runs auctions now.
	Leading() bool
	// Enqueue adds work to the next round.
	Enqueue(works []*placement.Work)
}

// Server implements auctioneerv1.AuctioneerServiceServer.
type Server struct {
	auctioneerv1.UnimplementedAuctioneerServiceServer
	q Queue
}

var _ auctioneerv1.AuctioneerServiceServer = (*Server)(nil)

// New returns a handler queuing work on q.
func New(q Queue) *Server { return &Server{q: q} }

// RequestLRPAuctions queues LRP instances for placement and returns at once.
func (s *Server) RequestLRPAuctions(_ context.Context, req *auctioneerv1.RequestLRPAuctionsRequest) (*auctioneerv1.RequestLRPAuctionsResponse, error) {
	if !s.q.Leading() {
		return nil, rpcerr.FailedPrecondition(ErrNotLeader)
	}
	s.q.Enqueue(auction.LRPWork(req.GetStarts()))
	return &auctioneerv1.RequestLRPAuctionsResponse{}, nil
}

// RequestTaskAuctions queues tasks for placement and returns at once.
func (s *Server) RequestTaskAuctions(_ context.Context, req *auctioneerv1.RequestTaskAuctionsRequest) (*auctioneerv1.RequestTaskAuctionsResponse, error) {
	if !s.q.Leading() {
		return nil, rpcerr.FailedPrecondition(ErrNotLeader)
	}
	s.q.Enqueue(auction.TaskWork(req.GetTasks()))
	return &auctioneerv1.RequestTaskAuctionsResponse{}, nil
}
