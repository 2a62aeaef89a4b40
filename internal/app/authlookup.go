package app

// The auth_user lookup: a user missing from the auth_file is asked of the
// upstream with usersInfo {showCredentials: true}, on a connection logged
// in as auth_user, and the answer goes through auth.Cache (TTLs, one
// lookup in flight per user, a timeout).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// errNoLookupRoute is wrapped when no route serves a user's database.
var errNoLookupRoute = errors.New("no route serves the user's database")

// authLookup implements auth.Lookup for auth_user. Which upstream is
// asked: the route that serves the user's authentication database (the
// route named after it), else the catch-all route. That is the deployment
// the user's data lives on, so the deployment that knows the user. The
// route and auth_user follow reloads (setConfig); auth_user's password is
// read from the users in force at each lookup.
type authLookup struct {
	resolver srv.Resolver
	log      *slog.Logger
	// authn gives the users in force (auth_user's password); set once
	// after auth.New, which needs the cache built on this lookup.
	authn *auth.Authenticator

	mu       sync.Mutex
	authUser string
	routes   map[string]config.EffectiveRoute
	// au logs in as auth_user for every lookup, so that its SCRAM keys
	// (a PBKDF2 per mechanism and upstream salt) are derived once, not per
	// lookup; rebuilt when auth_user or its password changes (reload).
	au *lookupAuth
}

// lookupAuth is auth_user's authenticator and what it was built from.
type lookupAuth struct {
	user, db, password string
	a                  upstream.HandshakeAuthenticator
}

// setConfig takes auth_user and the routes of cfg (at start and reload).
func (l *authLookup) setConfig(cfg config.Config, routes []config.EffectiveRoute) {
	m := make(map[string]config.EffectiveRoute, len(routes))
	for _, r := range routes {
		m[r.Name] = r
	}
	l.mu.Lock()
	l.authUser, l.routes = cfg.Global.AuthUser, m
	l.au = nil // a reload may change auth_user, its password or the upstreams
	l.mu.Unlock()
}

// authenticator returns the authenticator logging in as user@db with
// password: the one kept from earlier lookups, unless these differ.
func (l *authLookup) authenticator(user, db, password string) (upstream.HandshakeAuthenticator, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if au := l.au; au != nil && au.user == user && au.db == db && au.password == password {
		return au.a, nil
	}
	a, err := upstream.NewAuthenticator(upstream.Credential{Username: user, Password: password, Source: db})
	if err != nil {
		return nil, err
	}
	l.au = &lookupAuth{user: user, db: db, password: password, a: a}
	return a, nil
}

// route returns the route asked about users of db.
func (l *authLookup) route(db string) (config.EffectiveRoute, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.routes[db]; ok {
		return r, l.authUser, true
	}
	r, ok := l.routes[config.CatchAll]
	return r, l.authUser, ok
}

// Lookup implements auth.Lookup: it asks usersInfo of the route's writable
// primary (a standalone, a replica set's primary, a mongos), trying the
// hosts in order, and the primary a secondary names when it is not among
// them. Without a primary the lookup fails (not cached: the login fails
// and the next one asks again).
func (l *authLookup) Lookup(ctx context.Context, user, db string) (auth.Creds, error) {
	er, authUser, ok := l.route(db)
	if !ok {
		// An answer, not a failure to ask: cached with the negative TTL.
		return auth.Creds{}, fmt.Errorf("%w: %w (%s)", auth.ErrNotFound, errNoLookupRoute, db)
	}
	if l.authn == nil {
		return auth.Creds{}, errors.New("auth_user lookup: not ready")
	}
	auUser, auDB, _ := config.SplitUser(authUser)
	creds, _ := l.authn.Users().Lookup(auUser, auDB)
	pw, has := creds.Password()
	if !has {
		return auth.Creds{}, fmt.Errorf("auth_user %s has no plain password in auth_file", authUser)
	}
	cs := er.Conn
	if cs.SRV {
		var err error
		if cs, _, err = resolveSRV(cs, l.resolver); err != nil {
			return auth.Creds{}, fmt.Errorf("auth_user lookup on route %q: %w", er.Name, err)
		}
	}
	a, err := l.authenticator(auUser, auDB, pw)
	if err != nil {
		return auth.Creds{}, err
	}
	o := upstream.Options{AppName: er.AppName, ConnectTimeout: er.ConnectTimeout, MaxMessageSize: er.MaxMessageSize, Authenticator: a, Logger: l.log}
	if cs.TLS {
		if o.TLSConfig, err = tlsConfig(cs); err != nil {
			return auth.Creds{}, fmt.Errorf("auth_user lookup on route %q: %w", er.Name, err)
		}
	}
	d := upstream.NewDialer(o)
	cmd := usersInfoCommand(user, db)
	hosts := make([]string, 0, len(cs.Hosts)+1)
	for _, h := range cs.Hosts {
		hosts = append(hosts, h.Address)
	}
	var last error
	for i := 0; i < len(hosts); i++ {
		c, err := d.Dial(ctx, hosts[i], 0)
		if err != nil {
			last = err
			continue
		}
		if h := c.Hello(); h == nil || !h.IsWritablePrimary {
			// A secondary may lag: a password changed or a user dropped
			// on the primary would still be found there. Ask the primary
			// it names, once, if not among the hosts already.
			if h != nil && h.Primary != "" && !slices.Contains(hosts, h.Primary) && len(hosts) <= len(cs.Hosts) {
				hosts = append(hosts, h.Primary)
			}
			c.Close()
			last = fmt.Errorf("%s is not a writable primary", hosts[i])
			continue
		}
		reply, err := c.RoundTrip(ctx, db, cmd)
		c.Close()
		if err != nil {
			last = err
			continue
		}
		return auth.CredsFromUsersInfo(reply, user, db)
	}
	if last == nil {
		last = errors.New("no hosts")
	}
	return auth.Creds{}, fmt.Errorf("auth_user lookup of %s on route %q: %w", auth.UserID{User: user, DB: db}, er.Name, last)
}

// usersInfoCommand is {usersInfo: {user, db}, showCredentials: true,
// showAuthenticationRestrictions: true}, read from the primary only (Lookup
// dials the one that says it is): a secondary's users may lag the
// primary's, and a stale password or a dropped user must not log in.
func usersInfoCommand(user, db string) bsoncore.Document {
	u := bsoncore.NewDocumentBuilder().AppendString("user", user).AppendString("db", db).Build()
	rp := bsoncore.NewDocumentBuilder().AppendString("mode", "primary").Build()
	return bsoncore.NewDocumentBuilder().
		AppendDocument("usersInfo", u).
		AppendBoolean("showCredentials", true).
		AppendBoolean("showAuthenticationRestrictions", true).
		AppendDocument("$readPreference", rp).
		Build()
}
