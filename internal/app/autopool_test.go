package app

// max_pool_size = "auto" end to end through the app: the pools get an
// adaptive limit, SHOW CONFIG says "auto", and a reload switches between a
// fixed size and auto on the live pools.

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

func TestMaxPoolSizeAutoReload(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	path := filepath.Join(t.TempDir(), "mongobouncer.toml")
	write := func(size string, ceiling int) {
		doc := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\n[databases.\"*\"]\n"+
			"connection_string = \"mongodb://%s/?directConnection=true\"\nmax_pool_size = %s\nmax_pool_size_ceiling = %d\n",
			up.Addr(), size, ceiling)
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`"auto"`, 30)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	check := func(when string, wantAuto bool, wantMax int, shown any) {
		t.Helper()
		st := a.Topologies()[0].Servers()[0].Pool().Stats()
		if (st.Limiter != nil) != wantAuto || st.Options.MaxPoolSize != wantMax {
			t.Fatalf("%s: limiter %+v, max %d; want auto %v, max %d", when, st.Limiter, st.Options.MaxPoolSize, wantAuto, wantMax)
		}
		route := a.Config()["databases"].(map[string]any)["*"].(map[string]any)
		if route["max_pool_size"] != shown {
			t.Fatalf("%s: SHOW CONFIG max_pool_size = %v, want %v", when, route["max_pool_size"], shown)
		}
	}
	check("at start", true, 30, "auto")
	write("10", 30)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	check("after a reload to 10", false, 10, 10)
	write(`"auto"`, 5)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	check("after a reload to auto, ceiling 5", true, 5, "auto")
}
