package etcdx

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/gavel-sched/gavel/pkg/retry"
)

// Root is the versioned prefix of every key Gavel keeps in etcd. Each service builds its keys
// under it in one place: the BBS in services/bbs/internal/store/keys.go, the rep (its cell
// presence) in services/rep/internal/presence/keys.go, and elections here (LockKey).
const Root = "/gavel/v1/"

// LockRoot is the key prefix under which services elect their leaders: a service's contenders
// campaign under LockRoot + service (see LockKey).
const LockRoot = Root + "lock/"

// DefaultElectionTTL is the lease TTL used when an Election is given a zero TTL: a leader that
// stops refreshing its lease loses leadership this long afterwards.
const DefaultElectionTTL = 10 * time.Second

// Back-off between failed attempts to open a session or campaign.
const (
	electionRetryMin = 200 * time.Millisecond
	electionRetryMax = 5 * time.Second
)

// resignTimeout bounds resigning leadership when a term ends.
const resignTimeout = 5 * time.Second

// LockKey is the election prefix of service, e.g. "/gavel/v1/lock/auctioneer". Contenders'
// keys live under it, attached to their session leases; the oldest key leads.
func LockKey(service string) string { return LockRoot + service }

// Election is one contender for the leadership of a service, built on etcd's concurrency
// package: a session (a lease kept alive in the background) and a campaign under
// LockKey(service). Use Run to campaign and lead; IsLeader tells whether this contender leads now.
type Election struct {
	client  *clientv3.Client
	service string
	id      string
	ttl     time.Duration
	logger  hclog.Logger
	leader  atomic.Bool
}

// NewElection builds a contender for service's leadership. id is the value stored in the
// contender's key (e.g. a host name and address) so others can tell who leads. ttl is the
// session lease TTL, rounded up to whole seconds (zero means DefaultElectionTTL). logger may be
// nil.
func NewElection(client *clientv3.Client, service, id string, ttl time.Duration, logger hclog.Logger) (*Election, error) {
	switch {
	case client == nil:
		return nil, errors.New("election: etcd client is required")
	case service == "":
		return nil, errors.New("election: service name is required")
	case id == "":
		return nil, errors.New("election: contender id is required")
	case ttl < 0:
		return nil, fmt.Errorf("election: ttl must not be negative, got %s", ttl)
	}
	if ttl == 0 {
		ttl = DefaultElectionTTL
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Election{client: client, service: service, id: id, ttl: ttl, logger: logger}, nil
}

// RunElection campaigns for service's leadership as id and calls lead while leading; see
// Election.Run.
func RunElection(ctx context.Context, client *clientv3.Client, service, id string, ttl time.Duration,
	lead func(ctx context.Context) error) error {
	e, err := NewElection(client, service, id, ttl, nil)
	if err != nil {
		return err
	}
	return e.Run(ctx, lead)
}

// IsLeader reports whether this contender currently leads (from winning a campaign until its
// lead function has returned).
func (e *Election) IsLeader() bool { return e.leader.Load() }

// ID is the value this contender campaigns with.
func (e *Election) ID() string { return e.id }

// Leader returns the id of the current leader, or "" when nobody leads.
func (e *Election) Leader(ctx context.Context) (string, error) {
	resp, err := e.client.Get(ctx, LockKey(e.service)+"/", append(clientv3.WithFirstCreate(), clientv3.WithLimit(1))...)
	if err != nil {
		return "", fmt.Errorf("election %s: read leader: %w", e.service, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Run campaigns until ctx ends. Each time it wins, it calls lead with a context that is
// cancelled when leadership is lost (the session's lease expired or was revoked) or ctx ends;
// when lead returns it resigns, and unless ctx has ended it campaigns again in a new session.
//
// Run returns nil once ctx ends. It returns an error only when lead fails on its own while
// still leading (an error returned after the lead context was cancelled counts as a clean end
// of the term). Failures to reach etcd are logged and retried with back-off.
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	wait := retry.Policy{Initial: electionRetryMin, Max: electionRetryMax}.BackOff()
	for ctx.Err() == nil {
		won, err := e.term(ctx, lead)
		if err != nil {
			var le *leadError
			if errors.As(err, &le) {
				return le.err
			}
			if ctx.Err() != nil {
				break
			}
			next := wait.NextBackOff()
			e.logger.Warn("election attempt failed, retrying", "service", e.service, "error", err, "retry_in", next)
			if !retry.Sleep(ctx, next) {
				break
			}
			continue
		}
		if won {
			wait.Reset()
		}
	}
	return nil
}

// leadError marks a failure of the lead function itself, which ends Run.
type leadError struct{ err error }

// Error implements error.
func (e *leadError) Error() string { return e.err.Error() }

// term runs one session: campaign, lead, resign. It reports whether the campaign was won.
func (e *Election) term(ctx context.Context, lead func(ctx context.Context) error) (bool, error) {
	// The session outlives ctx so that closing it can still revoke the lease (an immediate
	// hand-over) after ctx has ended.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	ttl := int((e.ttl + time.Second - 1) / time.Second)
	session, err := concurrency.NewSession(e.client, concurrency.WithTTL(ttl), concurrency.WithContext(sctx))
	if err != nil {
		return false, fmt.Errorf("election %s: open session: %w", e.service, err)
	}
	defer func() {
		// Revokes the lease, deleting our key at once; the error only means it expires by TTL.
		if err := session.Close(); err != nil {
			e.logger.Debug("close election session", "service", e.service, "error", err)
		}
	}()

	// termCtx ends with ctx or with the session (lease expired or revoked).
	termCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-session.Done():
			cancel()
		case <-termCtx.Done():
		}
	}()

	el := concurrency.NewElection(session, LockKey(e.service))
	if err := el.Campaign(termCtx, e.id); err != nil {
		return false, fmt.Errorf("election %s: campaign: %w", e.service, err)
	}
	if termCtx.Err() != nil {
		// The session died while campaigning; our key went with it.
		return false, fmt.Errorf("election %s: session ended during campaign", e.service)
	}

	e.logger.Info("elected leader", "service", e.service, "id", e.id, "key", el.Key())
	e.leader.Store(true)
	err = lead(termCtx)
	e.leader.Store(false)
	lost := termCtx.Err() != nil
	cancel()

	rctx, rcancel := context.WithTimeout(sctx, resignTimeout)
	defer rcancel()
	if rerr := el.Resign(rctx); rerr != nil {
		e.logger.Debug("resign", "service", e.service, "error", rerr)
	}
	e.logger.Info("leadership ended", "service", e.service, "id", e.id, "lost", lost)
	if err != nil && !lost {
		return true, &leadError{err: fmt.Errorf("election %s: lead: %w", e.service, err)}
	}
	return true, nil
}
