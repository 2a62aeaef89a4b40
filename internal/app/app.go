// Package app wires a configuration into a running mongobouncer: one
// topology (servers, monitors, pools) per route, the proxy server, and its
// listeners. cmd/mongobouncer, the demo and end-to-end tests share it.
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// App is a configured mongobouncer with its listeners bound.
type App struct {
	cfg        config.Config
	log        *slog.Logger
	topologies []*topology.Topology
	server     *proxy.Server
	listeners  []listener

	wg       sync.WaitGroup
	serveErr chan error
}

type listener struct {
	l     net.Listener
	route *proxy.Route // nil: routes by $db
}

// ListenError reports an address that could not be bound (in use, bad
// permissions); the command exits non-zero with it.
type ListenError struct {
	Addr string
	Err  error
}

func (e *ListenError) Error() string { return fmt.Sprintf("listen on %s: %v", e.Addr, e.Err) }
func (e *ListenError) Unwrap() error { return e.Err }

// New validates cfg, builds every route and binds every listener. Nothing
// is served until Start.
func New(cfg config.Config, logger *slog.Logger) (*App, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	routes, err := cfg.Routes()
	if err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: logger, serveErr: make(chan error, 8)}
	var proxyRoutes []*proxy.Route
	dedicated := map[string]*proxy.Route{}
	for _, er := range routes {
		r, err := a.buildRoute(er)
		if err != nil {
			a.closeTopologies()
			return nil, err
		}
		proxyRoutes = append(proxyRoutes, r)
		if er.Listen != "" {
			dedicated[er.Listen] = r
		}
	}
	g := cfg.Global
	maxClients := g.MaxClientConn
	if maxClients == 0 {
		maxClients = math.MaxInt32
	}
	a.server, err = proxy.New(proxy.Options{
		Routes:            proxyRoutes,
		MaxClientConn:     maxClients,
		MaxMessageSize:    g.MaxMessageSize,
		ClientIdleTimeout: g.ClientIdleTimeout,
		Logger:            logger,
	})
	if err != nil {
		a.closeTopologies()
		return nil, err
	}
	if err := a.bind(g.Listen, nil); err != nil {
		a.Close(context.Background())
		return nil, err
	}
	for addr, r := range dedicated {
		if err := a.bind(addr, r); err != nil {
			a.Close(context.Background())
			return nil, err
		}
	}
	return a, nil
}

func (a *App) bind(addr string, r *proxy.Route) error {
	network, address, err := config.SplitListen(addr)
	if err != nil {
		return &ListenError{Addr: addr, Err: err}
	}
	if network == "unix" {
		// A socket file left by a crashed run would make Listen fail; remove
		// it only if nothing answers on it.
		if c, err := net.Dial("unix", address); err == nil {
			c.Close()
		} else {
			_ = os.Remove(address)
		}
	}
	l, err := net.Listen(network, address)
	if err != nil {
		return &ListenError{Addr: addr, Err: err}
	}
	a.listeners = append(a.listeners, listener{l: l, route: r})
	return nil
}

// buildRoute makes the topology of one route.
func (a *App) buildRoute(er config.EffectiveRoute) (*proxy.Route, error) {
	cs := er.Conn
	if cs.Username != "" || cs.AuthMechanism != "" {
		return nil, fmt.Errorf("route %q: upstream authentication is not supported yet; remove the credentials from its connection string", er.Name)
	}
	if cs.LoadBalanced {
		return nil, fmt.Errorf("route %q: loadBalanced upstreams are not supported yet", er.Name)
	}
	mode, err := proxy.ParsePoolMode(string(er.PoolMode))
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", er.Name, err)
	}
	var tlsCfg *tls.Config
	if cs.TLS {
		if tlsCfg, err = tlsConfig(cs); err != nil {
			return nil, fmt.Errorf("route %q: %w", er.Name, err)
		}
	}
	// er.AppName already applies the precedence (route > connection
	// string > global).
	appName := er.AppName
	hosts := make([]string, len(cs.Hosts))
	for i, h := range cs.Hosts {
		hosts[i] = h.Address
	}
	uo := upstream.Options{
		AppName:        appName,
		ConnectTimeout: er.ConnectTimeout,
		Compressors:    cs.Compressors,
		TLSConfig:      tlsCfg,
		MaxMessageSize: er.MaxMessageSize,
		Logger:         a.log,
	}
	mo := uo
	mo.Compressors = nil // monitoring sends tiny hellos: never worth compressing
	po := pool.DefaultOptions()
	po.MaxPoolSize = er.MaxPoolSize
	po.MinPoolSize = er.MinPoolSize
	po.MaxIdleTime = er.MaxIdleTime
	po.MaxConnecting = er.MaxConnecting
	po.WaitQueueTimeout = er.WaitQueueTimeout
	if a.log.Enabled(context.Background(), slog.LevelDebug) {
		po.Logger = a.log.With("route", er.Name)
	}
	t, err := topology.New(er.Name, topology.Options{
		Hosts:                  hosts,
		Pool:                   po,
		Dialer:                 upstream.NewDialer(uo),
		MonitorDialer:          upstream.NewDialer(mo),
		HeartbeatInterval:      er.HeartbeatInterval,
		HeartbeatTimeout:       er.ConnectTimeout,
		ServerSelectionTimeout: er.ServerSelectionTimeout,
		Logger:                 a.log.With("route", er.Name),
	})
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", er.Name, err)
	}
	a.topologies = append(a.topologies, t)
	a.log.Info("route configured", "route", er.Name, "upstream", cs.Redacted(), "pool_mode", mode.String(),
		"max_pool_size", er.MaxPoolSize)
	return &proxy.Route{Name: er.Name, Mode: mode, Topology: t}, nil
}

func tlsConfig(cs config.ConnString) (*tls.Config, error) {
	c := &tls.Config{InsecureSkipVerify: cs.TLSInsecure, MinVersion: tls.VersionTLS12}
	if cs.TLSCAFile != "" {
		pem, err := os.ReadFile(cs.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("tlsCAFile: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsCAFile %s: no certificate found", cs.TLSCAFile)
		}
	}
	if cs.TLSCertificateKeyFile != "" {
		if cs.TLSCertificateKeyFilePassword != "" {
			return nil, errors.New("tlsCertificateKeyFilePassword: encrypted keys are not supported yet")
		}
		cert, err := tls.LoadX509KeyPair(cs.TLSCertificateKeyFile, cs.TLSCertificateKeyFile)
		if err != nil {
			return nil, fmt.Errorf("tlsCertificateKeyFile: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// Addrs returns the bound listener addresses, the main one first.
func (a *App) Addrs() []net.Addr {
	out := make([]net.Addr, len(a.listeners))
	for i, l := range a.listeners {
		out[i] = l.l.Addr()
	}
	return out
}

// Server returns the proxy server.
func (a *App) Server() *proxy.Server { return a.server }

// Topologies returns the routes' topologies.
func (a *App) Topologies() []*topology.Topology { return a.topologies }

// Start serves every listener in the background.
func (a *App) Start() {
	for _, l := range a.listeners {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.log.Info("listening", "addr", l.l.Addr().String())
			if err := a.server.Serve(l.l, l.route); err != nil && !errors.Is(err, proxy.ErrServerClosed) {
				a.serveErr <- fmt.Errorf("serve %s: %w", l.l.Addr(), err)
			}
		}()
	}
}

// Errors delivers fatal listener errors.
func (a *App) Errors() <-chan error { return a.serveErr }

// Close stops listeners and clients, then closes every pool. ctx bounds the
// wait for client goroutines.
func (a *App) Close(ctx context.Context) error {
	var err error
	if a.server != nil {
		err = a.server.Close(ctx)
	}
	for _, l := range a.listeners {
		l.l.Close()
	}
	a.wg.Wait()
	a.closeTopologies()
	return err
}

func (a *App) closeTopologies() {
	for _, t := range a.topologies {
		t.Close()
	}
	a.topologies = nil
}
