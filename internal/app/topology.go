package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// newTopology makes the servers, monitors and pools of one route.
// eventLoop detaches pooled connections from Go's netpoller for the proxy's
// event loop. userMon gives each user pool of a pass-through route a
// Monitor of its own (their gauges add up under the route's and server's
// labels, so that the metrics have no label per user).
func newTopology(er config.EffectiveRoute, log *slog.Logger, mon pool.Monitor, userMon func() pool.Monitor, eventLoop bool, r srv.Resolver) (*topology.Topology, error) {
	cs := er.Conn
	var poll *topology.SRVPolling
	if cs.SRV {
		var err error
		if cs, poll, err = resolveSRV(cs, r); err != nil {
			return nil, fmt.Errorf("route %q: %w", er.Name, err)
		}
	}
	// The route's service user: pooled connections log in as it,
	// monitors never (the auth spec), so mo below has no Authenticator.
	auth, err := upstreamAuthenticator(cs)
	if err != nil {
		return nil, fmt.Errorf("route %q: upstream authentication: %w", er.Name, err)
	}
	if cs.LoadBalanced {
		return nil, fmt.Errorf("route %q: loadBalanced upstreams are not supported yet", er.Name)
	}
	var tlsCfg *tls.Config
	if cs.TLS {
		var err error
		if tlsCfg, err = tlsConfig(cs); err != nil {
			return nil, fmt.Errorf("route %q: %w", er.Name, err)
		}
	}
	hosts := make([]string, len(cs.Hosts))
	for i, h := range cs.Hosts {
		hosts[i] = h.Address
	}
	uo := upstream.Options{
		// er.AppName already applies the precedence (route > connection
		// string > global).
		AppName:        er.AppName,
		ConnectTimeout: er.ConnectTimeout,
		Compressors:    cs.Compressors,
		TLSConfig:      tlsCfg,
		MaxMessageSize: er.MaxMessageSize,
		Logger:         log,
	}
	mo := uo
	uo.Authenticator = auth
	// Only pooled connections of routes the loop serves: it never sees a
	// monitor's, nor a session-mode route's. (Either kind works for both
	// models; this only decides which is cheaper. A reload that changes
	// the pool mode keeps the connections as they are.)
	uo.Detach = eventLoop && er.PoolMode != config.PoolModeSession
	mo.Compressors = nil // monitoring sends tiny hellos: never worth compressing
	po := pool.DefaultOptions()
	lim := limitsOf(er)
	po.MaxPoolSize = lim.MaxPoolSize
	po.MinPoolSize = lim.MinPoolSize
	po.MaxIdleTime = lim.MaxIdleTime
	po.MaxConnecting = lim.MaxConnecting
	po.WaitQueueTimeout = lim.WaitQueueTimeout
	po.Adaptive = lim.Adaptive
	po.Monitor = mon
	// No po.Logger: the topology gives its pools its own logger, so that
	// the CMAP log messages appear whenever the (reloadable) level allows.
	dialer := upstream.NewDialer(uo)
	var userDialer func(upstream.Authenticator) pool.Connector
	if er.PassThrough {
		// The same connections as the route's, logging in as one user.
		userDialer = func(a upstream.Authenticator) pool.Connector { return dialer.WithAuthenticator(a) }
	}
	t, err := topology.New(er.Name, topology.Options{
		Hosts:                  hosts,
		ReplicaSet:             cs.ReplicaSet,
		DirectConnection:       cs.DirectConnection,
		SRV:                    poll,
		MonitoringMode:         cs.ServerMonitoringMode,
		LocalThreshold:         er.LocalThreshold,
		Pool:                   po,
		Dialer:                 dialer,
		UserDialer:             userDialer,
		MaxUserConnections:     er.MaxUserConnections,
		MaxDBConnections:       er.MaxDBConnections,
		UserPoolIdleTimeout:    er.UserPoolIdleTimeout,
		UserPoolMonitor:        userMon,
		MonitorDialer:          upstream.NewDialer(mo),
		HeartbeatInterval:      er.HeartbeatInterval,
		HeartbeatTimeout:       er.ConnectTimeout,
		ServerSelectionTimeout: er.ServerSelectionTimeout,
		Logger:                 log.With("route", er.Name),
	})
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", er.Name, err)
	}
	return t, nil
}

// sameTopology reports whether two effective routes can share one topology:
// everything that shapes servers, monitors and connections is equal, so
// only live pool limits and the pool mode differ.
func sameTopology(a, b config.EffectiveRoute) bool {
	ca, cb := a.Conn, b.Conn
	return ca.Redacted() == cb.Redacted() && ca.Password == cb.Password &&
		ca.TLSCertificateKeyFilePassword == cb.TLSCertificateKeyFilePassword &&
		slices.Equal(ca.Compressors, cb.Compressors) &&
		a.AppName == b.AppName && a.ConnectTimeout == b.ConnectTimeout &&
		a.HeartbeatInterval == b.HeartbeatInterval && a.ServerSelectionTimeout == b.ServerSelectionTimeout &&
		a.MaxMessageSize == b.MaxMessageSize && a.LocalThreshold == b.LocalThreshold &&
		a.ReadPreference == b.ReadPreference && a.MaxStaleness == b.MaxStaleness &&
		a.PassThrough == b.PassThrough && a.UserPoolIdleTimeout == b.UserPoolIdleTimeout &&
		slices.EqualFunc(a.ReadPreferenceTags, b.ReadPreferenceTags, maps.Equal)
}

// srvLookupTimeout bounds the SRV and TXT lookups of a mongodb+srv://
// route at start and reload.
const srvLookupTimeout = 10 * time.Second

// resolveSRV resolves a mongodb+srv:// connection string: the hosts from
// its SRV records, and from its TXT record the replicaSet and loadBalanced
// the string does not set itself (initial-dns-seedlist-discovery). The
// polling it returns keeps a mongos list current.
func resolveSRV(cs config.ConnString, r srv.Resolver) (config.ConnString, *topology.SRVPolling, error) {
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(context.Background(), srvLookupTimeout)
	defer cancel()
	o := srv.Options{ServiceName: cs.SRVServiceName, MaxHosts: cs.SRVMaxHosts}
	res, err := srv.Resolve(ctx, r, cs.SRVHost, o)
	if err != nil {
		return cs, nil, err
	}
	cs.Hosts = make([]config.Host, len(res.Hosts))
	for i, h := range res.Hosts {
		cs.Hosts[i] = config.Host{Network: config.NetworkTCP, Address: h}
	}
	if cs.ReplicaSet == "" {
		cs.ReplicaSet = res.TXT.ReplicaSet
	}
	applyTXTAuthSource(&cs, res.TXT.AuthSource)
	if res.TXT.LoadBalanced != nil && *res.TXT.LoadBalanced {
		return cs, nil, fmt.Errorf("%s: its TXT record says loadBalanced=true: loadBalanced upstreams are not supported yet", cs.SRVHost)
	}
	return cs, &topology.SRVPolling{Host: cs.SRVHost, Options: o, Resolver: r}, nil
}

// routeReadPref is the route's default read preference for the proxy: nil
// for primary, the mode and tag sets otherwise (validated with the
// configuration).
func routeReadPref(er config.EffectiveRoute) (*sdam.ReadPref, error) {
	mode, err := sdam.ParseMode(string(er.ReadPreference))
	if err != nil {
		return nil, err
	}
	if mode == sdam.Primary {
		return nil, nil
	}
	rp := &sdam.ReadPref{Mode: mode, MaxStaleness: er.MaxStaleness}
	for _, ts := range er.ReadPreferenceTags {
		rp.TagSets = append(rp.TagSets, sdam.TagSet(maps.Clone(ts)))
	}
	if err := rp.Validate(er.HeartbeatInterval); err != nil {
		return nil, err
	}
	return rp, nil
}
