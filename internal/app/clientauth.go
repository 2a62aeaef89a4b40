package app

// Client authentication: the auth_file read at start and on every reload,
// and the proxy's ClientAuth built from it.

import (
	"fmt"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
)

// loadAuthUsers reads cfg's auth_file for auth type t (the running one on
// reload), and checks that auth_user's password is in it. It returns nil
// users for auth_type none, and for x509 without an auth_file.
func loadAuthUsers(cfg config.Config, t config.AuthType) (*auth.Users, error) {
	if t == "" || t == config.AuthNone {
		return nil, nil
	}
	path := cfg.AuthFilePath()
	if path == "" {
		if t == config.AuthSCRAM {
			return nil, fmt.Errorf(`auth_type = "scram" is running and the configuration has no auth_file (auth_type changes need a restart): %w`, auth.ErrAuthFile)
		}
		return &auth.Users{}, nil
	}
	users, err := auth.LoadFile(path)
	if err != nil {
		return nil, err
	}
	if u := cfg.Global.AuthUser; u != "" {
		user, db, _ := config.SplitUser(u)
		creds, ok := users.Lookup(user, db)
		if _, has := creds.Password(); !ok || !has {
			return nil, &auth.FileError{File: path, Msg: fmt.Sprintf("auth_user %s needs a line with its plain password (it logs in upstream with it)", u)}
		}
	}
	return users, nil
}

// newClientAuth builds the proxy's ClientAuth, or nil for auth_type none.
func newClientAuth(cfg config.Config, users *auth.Users) *proxy.ClientAuth {
	g := cfg.Global
	if g.AuthType == "" || g.AuthType == config.AuthNone {
		return nil
	}
	return &proxy.ClientAuth{
		Users: auth.New(users, g.AdminUsers, authUserLookup(cfg, users)),
		X509:  g.AuthType == config.AuthX509,
	}
}

// authUserLookup is the seam for auth_user: a cache in front of a Lookup
// that asks the upstream (usersInfo {user, db}, showCredentials: true, on
// a connection logged in as auth_user with its password from users) for
// the users the auth_file lacks. It needs upstream authentication, which
// is not here yet, so no user is looked up: nil.
func authUserLookup(cfg config.Config, users *auth.Users) *auth.Cache {
	_, _ = cfg, users
	return nil
}
