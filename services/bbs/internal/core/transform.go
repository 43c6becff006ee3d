package core

import (
	"context"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Transformer augments work before it is stored: the transformer plugin chain
// (*transform.Chain). It returns the object to store or an error (pkg/rpcerr kinds) that fails
// the request; its failure policies (fail, ignore) are its own business.
type Transformer interface {
	DesiredLRP(ctx context.Context, lrp *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error)
	Task(ctx context.Context, task *modelsv1.Task) (*modelsv1.Task, error)
}

// transformLRP runs a desired LRP through the transformer, when one is configured.
func (c *deps) transformLRP(ctx context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
	if c.cfg.Transformer == nil {
		return d, nil
	}
	return c.cfg.Transformer.DesiredLRP(ctx, d)
}

// transformTask runs a task's definition (with its guid and domain) through the transformer,
// when one is configured, and returns the definition to store.
func (c *deps) transformTask(ctx context.Context, guid, domain string, def *modelsv1.TaskDefinition) (*modelsv1.TaskDefinition, error) {
	if c.cfg.Transformer == nil {
		return def, nil
	}
	out, err := c.cfg.Transformer.Task(ctx, &modelsv1.Task{TaskGuid: guid, Domain: domain, Definition: def})
	if err != nil {
		return nil, err
	}
	return out.GetDefinition(), nil
}

// lrpTransformMemo remembers the last transformation inside one store.Update, whose function
// may run again on the same data (a cache re-check, a lost compare): the plugins are then not
// called twice for the same merged object. New data is transformed afresh.
type lrpTransformMemo struct {
	in, out *modelsv1.DesiredLRP
	err     error
}

func (m *lrpTransformMemo) transform(ctx context.Context, c *deps, merged *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
	if m.in != nil && proto.Equal(m.in, merged) {
		return m.out, m.err
	}
	m.in = merged
	m.out, m.err = c.transformLRP(ctx, merged)
	return m.out, m.err
}
