package app

import (
	"context"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

func TestAdminListenWithoutHostIsLoopback(t *testing.T) {
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = ":0"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Close(ctx)
	}()
	host := a.AdminAddr().String()
	if host[:len("127.0.0.1:")] != "127.0.0.1:" {
		t.Fatalf("admin listener bound to %s, want loopback", host)
	}
}
