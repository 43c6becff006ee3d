// Command networking is an example transformer plugin for container networking: it adds the
// properties app_guid and network_id to every desired LRP and task, taken from the work's
// labels (app_guid, network_id) or, when a label is absent, its environment (APP_GUID,
// NETWORK_ID). The cell passes properties untouched to its container hooks, where a networking
// integration reads them.
//
//	networking -socket /var/run/gavel/networking.sock [-require-app-guid] [-property-prefix network.]
//
// Work without an app guid passes unchanged, or is refused as the caller's fault (an external
// error) with -require-app-guid. See docs/plugins.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

// Version is the plugin's version, answered by describe.
const Version = "1.0.0"

func main() {
	var (
		socket  = flag.String("socket", "/tmp/gavel-networking.sock", "UNIX socket to serve on")
		name    = flag.String("name", "networking", "plugin name answered by describe (a DNS subdomain)")
		require = flag.Bool("require-app-guid", false, "refuse work without an app guid (an external error) instead of passing it unchanged")
		prefix  = flag.String("property-prefix", "", "prefix of the added property keys (e.g. \"network.\")")
	)
	flag.Parse()
	n := networking{requireAppGuid: *require, prefix: *prefix}
	p := &plugin.Plugin{
		Name:    *name,
		Version: Version,
		DesiredLRP: func(_ context.Context, d *modelsv1.DesiredLRP) (*modelsv1.DesiredLRP, error) {
			props, err := n.properties(d.GetProperties(), d.GetLabels(), d.GetEnv())
			d.Properties = props
			return d, err
		},
		Task: func(_ context.Context, t *modelsv1.Task) (*modelsv1.Task, error) {
			def := t.GetDefinition()
			props, err := n.properties(def.GetProperties(), def.GetLabels(), def.GetEnv())
			def.Properties = props
			return t, err
		},
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	l, err := plugin.Listen(*socket)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "networking plugin %s serving on %s\n", Version, *socket)
	if err := p.ServeListener(ctx, l); err != nil {
		log.Fatal(err)
	}
}

// networking computes the properties.
type networking struct {
	requireAppGuid bool
	prefix         string
}

// properties returns props with app_guid and network_id set from labels or env.
func (n networking) properties(props, labels map[string]string, env []*modelsv1.EnvironmentVariable) (map[string]string, error) {
	appGuid := lookup(labels, env, "app_guid", "APP_GUID")
	if appGuid == "" {
		if n.requireAppGuid {
			return props, &plugin.Error{Message: `no app guid: set the label "app_guid" or the environment variable APP_GUID`, External: true}
		}
		return props, nil
	}
	out := make(map[string]string, len(props)+2)
	for k, v := range props {
		out[k] = v
	}
	out[n.prefix+"app_guid"] = appGuid
	if id := lookup(labels, env, "network_id", "NETWORK_ID"); id != "" {
		out[n.prefix+"network_id"] = id
	}
	return out, nil
}

// lookup is the label, or else the last environment variable of that name.
func lookup(labels map[string]string, env []*modelsv1.EnvironmentVariable, label, envName string) string {
	if v := labels[label]; v != "" {
		return v
	}
	v := ""
	for _, e := range env {
		if e.GetName() == envName {
			v = e.GetValue()
		}
	}
	return v
}
