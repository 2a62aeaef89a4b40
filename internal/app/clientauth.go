package app

// Client authentication: the auth_file read at start and on every reload,
// and the proxy's ClientAuth built from it.

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/srv"
)

// loadAuthUsers reads cfg's auth_file for auth type t (the running one on
// reload), and checks that auth_user's password is in it. It returns nil
// users for auth_type none, and for x509 without an auth_file. A file that
// group or others may read is used, with a warning on log (at start and on
// every reload, as ssh warns of a key file).
func loadAuthUsers(cfg config.Config, t config.AuthType, log *slog.Logger) (*auth.Users, error) {
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
	warnAuthFileMode(log, path)
	if u := cfg.Global.AuthUser; u != "" {
		user, db, _ := config.SplitUser(u)
		creds, ok := users.Lookup(user, db)
		if _, has := creds.Password(); !ok || !has {
			return nil, &auth.FileError{File: path, Msg: fmt.Sprintf("auth_user %s needs a line with its plain password (it logs in upstream with it)", u)}
		}
	}
	return users, nil
}

// seedAuthKeys derives the salts of the auth_file's plain passwords and the
// fake credentials of unknown users from the auth_file's contents (at
// start only, before the file is parsed): the same file gives the same
// salts after a restart, so that a restart does not tell the fakes out.
// Without an auth_file, or one that cannot be read (loadAuthUsers says
// why), the process keeps a random key.
func seedAuthKeys(cfg config.Config) {
	if path := cfg.AuthFilePath(); path != "" {
		if data, err := os.ReadFile(path); err == nil {
			auth.SeedKeys(data)
		}
	}
}

// newClientAuth builds the proxy's ClientAuth, or nil for auth_type none.
// With auth_user set it also returns the lookup behind the auth_user
// cache, which reloads must keep up to date (setConfig, setCacheConfig);
// nil otherwise. obs, when not nil, counts failed logins and lookups.
func newClientAuth(cfg config.Config, users *auth.Users, routes []config.EffectiveRoute, r srv.Resolver, log *slog.Logger, obs auth.Observer) (*proxy.ClientAuth, *authLookup) {
	g := cfg.Global
	if g.AuthType == "" || g.AuthType == config.AuthNone {
		return nil, nil
	}
	var (
		cache *auth.Cache
		l     *authLookup
	)
	if g.AuthUser != "" && g.AuthType == config.AuthSCRAM {
		l = &authLookup{resolver: r, log: log}
		l.setConfig(cfg, routes)
		cache = auth.NewCache(l, auth.CacheOptions{PositiveTTL: g.AuthCacheTTL, MaxLookupsPerPeer: g.AuthLookupsPerPeer, MaxLookups: g.AuthMaxLookups})
	}
	ca := &proxy.ClientAuth{
		Users: auth.New(users, adminIDs(g.AdminUsers), cache),
		X509:  g.AuthType == config.AuthX509,
	}
	ca.Users.SetLogger(log)
	if obs != nil {
		ca.Users.SetObserver(obs)
	}
	if l != nil {
		l.authn = ca.Users
	}
	return ca, l
}

// setCacheConfig applies a reload's auth_cache_ttl and
// auth_lookups_per_peer to the auth_user cache, if there is one.
func setCacheConfig(a *auth.Authenticator, g config.Global) {
	if c := a.Cache(); c != nil {
		c.SetTTL(g.AuthCacheTTL)
		c.SetLimits(g.AuthLookupsPerPeer)
	}
}

// adminIDs reads admin_users ("user@db", split at the last @ as the
// auth_file's users are; validation has refused any other form).
func adminIDs(admins []string) []auth.UserID {
	out := make([]auth.UserID, 0, len(admins))
	for _, s := range admins {
		if id, ok := auth.ParseUserID(s); ok {
			out = append(out, id)
		}
	}
	return out
}

// warnAuthFileMode warns when the auth_file at path is open to more than
// it needs: it holds passwords, or secrets that log in upstream as their
// users (pass-through). The rule is PostgreSQL's for its key files: at most
// 0600 when another user owns it, and at most 0640 when root owns it (a
// root-owned file read through a group, as Kubernetes mounts a Secret
// with fsGroup). Windows has no such mode bits.
func warnAuthFileMode(log *slog.Logger, path string) {
	if runtime.GOOS == "windows" || log == nil {
		return
	}
	fi, err := os.Stat(path)
	if err != nil {
		return // LoadFile has just read it; gone since, the next reload says so
	}
	uid, known := fileOwner(fi)
	if perm := fi.Mode().Perm(); authFileTooOpen(perm, uid, known) {
		log.Warn("the auth_file may be read or written by users other than its owner (and, for a root-owned file, its group's readers); it holds secrets: chmod 600 it, or 640 owned by root",
			"auth_file", path, "mode", fmt.Sprintf("%#o", perm))
	}
}

// authFileTooOpen is the rule of warnAuthFileMode for a file of mode perm
// owned by uid (when known).
func authFileTooOpen(perm os.FileMode, uid uint32, known bool) bool {
	if known && uid == 0 {
		return perm&0o037 != 0 // group may read, nothing more
	}
	return perm&0o077 != 0
}
