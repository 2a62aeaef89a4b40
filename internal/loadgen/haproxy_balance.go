// HAProxy as a balancer in front of several instances (of mongobouncer),
// as a Kubernetes Service or a TCP load balancer puts them: connections
// spread round robin, a server whose port refuses connections is taken out
// by a health check and a connection refused by it goes to another. The
// tests of a drain behind a balancer (loadBalanced=true against a plain
// URI) run it.

package loadgen

import (
	"fmt"
	"strings"
)

// HAProxyBalancedConfig is the configuration StartHAProxy runs when
// HAProxyOptions.Balance is set: TCP mode, one frontend on listen, a
// round-robin backend over upstreams. Each server is checked by a TCP
// connect every 200 ms and is out after one failure, in after two
// successes; "option redispatch" with "retries 3" sends a connection that a
// server refused (a draining instance has closed its listener) to another
// one, as a Service does once the endpoint is gone. Established
// connections are left alone when a server goes down: the instance drains
// them itself.
func HAProxyBalancedConfig(listen string, upstreams []string, threads, maxConn int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by mongobouncer's load tool (internal/loadgen/haproxy_balance.go):
# a TCP balancer over several instances, as a Service in front of them.
global
    nbthread %d
    maxconn %d

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout check 1s
    retries 3
    option redispatch
    maxconn %d

frontend mongo
    bind %s
    default_backend upstream

backend upstream
    balance roundrobin
    default-server check inter 200ms fall 1 rise 2
`, threads, maxConn, maxConn, listen)
	for i, u := range upstreams {
		fmt.Fprintf(&b, "    server upstream%d %s\n", i, u)
	}
	return b.String()
}
