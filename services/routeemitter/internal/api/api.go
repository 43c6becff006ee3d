// Package api serves the routing table over gRPC (routeemitterv1.RouteEmitterService): a hub
// holds the published table, its version, a bounded history of deltas and the watchers; the
// handlers are thin readers of it.
package api

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// Server implements routeemitterv1.RouteEmitterServiceServer over a Hub.
type Server struct {
	routeemitterv1.UnimplementedRouteEmitterServiceServer
	hub *Hub
}

var _ routeemitterv1.RouteEmitterServiceServer = (*Server)(nil)

// New returns the handlers for hub.
func New(hub *Hub) *Server { return &Server{hub: hub} }

// errNotSynced answers calls made before the first sync with the BBS.
var errNotSynced = status.Error(codes.Unavailable, "the routing table has not been synced with the BBS yet")

// RoutingTable implements routeemitterv1.RouteEmitterServiceServer. Before the first sync with
// the BBS it fails with Unavailable rather than serve an empty table.
func (s *Server) RoutingTable(ctx context.Context, _ *routeemitterv1.RoutingTableRequest) (*routeemitterv1.RoutingTableResponse, error) {
	select {
	case <-s.hub.Synced():
	default:
		return nil, errNotSynced
	}
	routes, version := s.hub.Table()
	return &routeemitterv1.RoutingTableResponse{TableId: s.hub.TableID(), Version: version, Routes: routes}, nil
}

// WatchRoutes implements routeemitterv1.RouteEmitterServiceServer. It waits for the first sync
// with the BBS, sends a snapshot (or, when the caller holds this table_id and the history still
// has every later version, just those deltas), then every delta. A watcher that falls more
// than the queue limit behind is sent a fresh snapshot.
func (s *Server) WatchRoutes(req *routeemitterv1.WatchRoutesRequest, stream grpc.ServerStreamingServer[routeemitterv1.WatchRoutesResponse]) error {
	ctx := stream.Context()
	select {
	case <-s.hub.Synced():
	case <-ctx.Done():
		return nil
	case <-s.hub.closed:
		return status.Error(codes.Unavailable, ErrClosed.Error())
	}
	w, first := s.hub.Watch(req.GetTableId(), req.GetSinceVersion())
	defer w.Close()
	msgs := first
	for {
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		var err error
		msgs, err = w.Next(ctx)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return status.Error(codes.Unavailable, err.Error())
			}
			return nil // the caller went away
		}
	}
}
