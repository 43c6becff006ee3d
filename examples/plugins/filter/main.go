// Command filter is the Smith example of a transformer plugin: it keeps only the environment
// variables whose names start with a configured prefix, in every desired LRP and task, and
// drops the rest (so only, say, FOO_* settings reach the containers).
//
//	filter -socket /var/run/gavel/filter.sock -prefix FOO_
//
// See docs/plugins.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

// Version is the plugin's version, answered by describe.
const Version = "1.0.0"

func main() {
	var (
		socket = flag.String("socket", "/tmp/gavel-filter.sock", "UNIX socket to serve on")
		name   = flag.String("name", "filter", "plugin name answered by describe (a DNS subdomain)")
		prefix = flag.String("prefix", "", "keep only environment variables whose names start with this prefix (required)")
	)
	flag.Parse()
	if *prefix == "" {
		log.Fatal("filter: -prefix is required")
	}
	p := &plugin.Plugin{
		Name:    *name,
		Version: Version,
		DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
			d.Env = keep(d.GetEnv(), *prefix)
			return d, nil
		},
		Task: func(_ context.Context, t *modelsv1.Task) (*modelsv1.Task, error) {
			if t.GetDefinition() != nil {
				t.Definition.Env = keep(t.GetDefinition().GetEnv(), *prefix)
			}
			return t, nil
		},
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	l, err := plugin.Listen(*socket)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "filter plugin %s keeping env %s* serving on %s\n", Version, *prefix, *socket)
	if err := p.ServeListener(ctx, l); err != nil {
		log.Fatal(err)
	}
}

// keep returns the variables whose names start with prefix, in their order.
func keep(env []*modelsv1.EnvironmentVariable, prefix string) []*modelsv1.EnvironmentVariable {
	var out []*modelsv1.EnvironmentVariable
	for _, e := range env {
		if strings.HasPrefix(e.GetName(), prefix) {
			out = append(out, e)
		}
	}
	return out
}
