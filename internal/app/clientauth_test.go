package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
)

func TestLoadAuthUsers(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.Path = filepath.Join(dir, "mb.toml")
	cfg.Global.AuthType = config.AuthSCRAM
	cfg.Global.AuthFile = "users.txt" // relative to the configuration file
	cfg.Global.AuthUser = "mb@admin"
	hashed, _ := auth.HashPassword("mb", "admin", "pw")

	write(`"app@admin" "x"` + "\n" + hashed + "\n")
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM); err == nil || !strings.Contains(err.Error(), "auth_user mb@admin needs a line with its plain password") {
		t.Fatalf("auth_user with a stored secret only: %v", err)
	}
	write(`"app@admin" "x"` + "\n" + `"mb@admin" "pw"` + "\n")
	users, err := loadAuthUsers(cfg, config.AuthSCRAM)
	if err != nil || users.Len() != 2 {
		t.Fatalf("%v %v", users, err)
	}
	if ca, _ := newClientAuth(cfg, users, nil, nil, nil); ca == nil || ca.X509 || ca.Users.Users() != users {
		t.Fatalf("client auth %+v", ca)
	}
	write("\"broken\n")
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM); !errors.Is(err, auth.ErrAuthFile) || !strings.Contains(err.Error(), "users.txt:1:") {
		t.Fatalf("bad file: %v", err)
	}
	if u, err := loadAuthUsers(cfg, config.AuthNone); u != nil || err != nil {
		t.Fatal("auth_type none reads no file", u, err)
	}
	cfg.Global.AuthFile = ""
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM); !errors.Is(err, auth.ErrAuthFile) {
		t.Fatalf("scram running, no auth_file: %v", err)
	}
	cfg.Global.AuthType = config.AuthNone
	if ca, _ := newClientAuth(cfg, nil, nil, nil, nil); ca != nil {
		t.Fatal("auth_type none makes no ClientAuth")
	}
}

// authLookup asks the route named after the user's database, else the
// catch-all; with neither, the user is not found (cached negatively, no
// upstream asked).
func TestAuthLookupRoute(t *testing.T) {
	l := &authLookup{}
	cfg := config.Default()
	cfg.Global.AuthUser = "mb@admin"
	l.setConfig(cfg, []config.EffectiveRoute{{Name: "shop"}, {Name: config.CatchAll}})
	if r, au, ok := l.route("shop"); !ok || r.Name != "shop" || au != "mb@admin" {
		t.Fatalf("shop: %q %q %v", r.Name, au, ok)
	}
	if r, _, ok := l.route("admin"); !ok || r.Name != config.CatchAll {
		t.Fatalf("admin: %q %v, want the catch-all", r.Name, ok)
	}
	l.setConfig(cfg, []config.EffectiveRoute{{Name: "shop"}})
	if _, err := l.Lookup(context.Background(), "u", "admin"); !errors.Is(err, auth.ErrNotFound) || !errors.Is(err, errNoLookupRoute) {
		t.Fatalf("no route for admin: %v", err)
	}
}
