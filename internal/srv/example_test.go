package srv_test

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/srv"
)

// Example shows the caller's part: resolve once before connecting, merge
// the TXT options under the connection string's own, and poll only when
// the deployment is not a replica set or behind a load balancer. It has no
// Output line because it needs real DNS.
func Example() {
	ctx := context.Background()
	host := "cluster0.example.com" // from mongodb+srv://cluster0.example.com/
	o := srv.Options{ServiceName: "mongodb", MaxHosts: 0}

	res, err := srv.Resolve(ctx, net.DefaultResolver, host, o)
	if err != nil {
		slog.Error("mongodb+srv lookup", "error", err)
		return
	}
	// ... seed the topology with res.Hosts; use res.TXT.AuthSource,
	// ReplicaSet and LoadBalanced only where the URI does not set them ...

	lb := res.TXT.LoadBalanced != nil && *res.TXT.LoadBalanced
	if res.TXT.ReplicaSet != "" || lb {
		return
	}
	p, err := srv.StartPoller(ctx, net.DefaultResolver, host, res.Hosts, srv.PollOptions{
		Options:       o,
		RetryInterval: 10 * time.Second, // the route's heartbeatFrequencyMS
		Logger:        slog.Default(),
		OnChange: func(hosts []string) {
			// ... add the new hosts to the topology, remove the gone ones ...
		},
	})
	if err != nil {
		return
	}
	defer p.Close()
}
