package app

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// budgetOf resolves cfg's routes and computes its budget against limit.
func budgetOf(t *testing.T, cfg config.Config, limit uint64) FDBudget {
	t.Helper()
	routes, err := cfg.Routes()
	if err != nil {
		t.Fatal(err)
	}
	return fdBudget(cfg, routes, limit)
}

func TestFDBudgetCounts(t *testing.T) {
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = "127.0.0.1:0"
	cfg.Global.MaxClientConn = 1000
	pool := 10
	cfg.Databases = map[string]config.Route{
		"*":      {ConnectionString: "mongodb://a:27017,b:27017,c:27017/?replicaSet=rs"},
		"orders": {ConnectionString: "mongodb://d:27017/", Overrides: config.Overrides{MaxPoolSize: &pool}, Listen: "127.0.0.1:0"},
	}
	b := budgetOf(t, cfg, 20000)
	// "*": 3 servers x (100 pooled + 2 monitoring); orders: 1 x (10 + 2).
	if want := 3*(100+2) + 1*(10+2); b.Upstream != want {
		t.Errorf("Upstream = %d, want %d", b.Upstream, want)
	}
	// main, admin and orders' own listener, plus the margin.
	if want := 3 + fdMargin; b.Fixed != want {
		t.Errorf("Fixed = %d, want %d", b.Fixed, want)
	}
	if want := uint64(1000 + b.Upstream + b.Fixed); b.Need() != want {
		t.Errorf("Need = %d, want %d", b.Need(), want)
	}
	if b.Short() {
		t.Errorf("1000 clients reported short of a limit of 20000: %+v", b)
	}
	if want := 20000 - b.Upstream - b.Fixed; b.ClientsThatFit() != want {
		t.Errorf("ClientsThatFit = %d, want %d", b.ClientsThatFit(), want)
	}

	cfg.Global.MaxClientConn = 100_000
	b = budgetOf(t, cfg, 20000)
	if !b.Short() {
		t.Fatalf("100,000 clients not short of a limit of 20000: %+v", b)
	}
	// 20000 - 318 upstream - 67 fixed.
	for _, want := range []string{"max_client_conn = 100000", "open-file limit is 20000", "about 19615 clients fit", "LimitNOFILE"} {
		if !strings.Contains(b.Warning(), want) {
			t.Errorf("warning %q lacks %q", b.Warning(), want)
		}
	}
	// No cap on clients is not "short": nothing says how many will come.
	cfg.Global.MaxClientConn = 0
	if b := budgetOf(t, cfg, 20000); b.Short() {
		t.Errorf("max_client_conn = 0 reported short: %+v", b)
	}
	// An unknown limit is never short.
	cfg.Global.MaxClientConn = 100_000
	if b := budgetOf(t, cfg, 0); b.Short() {
		t.Errorf("unknown limit reported short: %+v", b)
	}
}

func TestFDBudgetSRVAndUncappedPool(t *testing.T) {
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.MaxClientConn = 500
	zero := 0
	cfg.Databases = map[string]config.Route{
		"*":   {ConnectionString: "mongodb+srv://cluster.example.com/", Overrides: config.Overrides{MaxPoolSize: &zero}},
		"few": {ConnectionString: "mongodb+srv://other.example.com/?srvMaxHosts=5"},
	}
	b := budgetOf(t, cfg, 1<<20)
	// "*": srvHostsGuess servers with a pool as large as the clients;
	// few: srvMaxHosts servers with the default pool of 100.
	if want := srvHostsGuess*(500+2) + 5*(100+2); b.Upstream != want {
		t.Errorf("Upstream = %d, want %d", b.Upstream, want)
	}
}

// An App whose max_client_conn the limit cannot hold stays ready, says so
// in Ready's lines, and warns once at startup.
func TestAppWarnsWhenClientsExceedFileLimit(t *testing.T) {
	before, after, err := RaiseFileLimit()
	if err != nil || after == 0 {
		t.Skipf("no open-file limit here (%d -> %d, %v)", before, after, err)
	}
	if after < before {
		t.Fatalf("RaiseFileLimit lowered the limit: %d -> %d", before, after)
	}
	up := fakemongo.Start(t, fakemongo.Options{})
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.MaxClientConn = int(min(after, 1<<40)) + 1000
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(up.URI())}}
	var logs logbuf.Buffer
	a, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	if !strings.Contains(logs.String(), "level=WARN msg=\"max_client_conn exceeds what the open-file limit can hold\"") {
		t.Errorf("no startup warning in the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "msg=\"open-file limit\"") {
		t.Errorf("no open-file limit line in the log:\n%s", logs.String())
	}
	_, why := a.Ready()
	found := false
	for _, w := range why {
		found = found || strings.HasPrefix(w, "warning: max_client_conn = ")
	}
	if !found {
		t.Errorf("Ready() lines %q lack the open-file warning", why)
	}

	cfg.Global.MaxClientConn = 10
	var logs2 logbuf.Buffer
	b, err := New(cfg, slog.New(slog.NewTextHandler(&logs2, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(b) })
	if strings.Contains(logs2.String(), "level=WARN msg=\"max_client_conn") {
		t.Errorf("warning with 10 clients:\n%s", logs2.String())
	}
	_, why = b.Ready()
	for _, w := range why {
		if strings.Contains(w, "open-file") {
			t.Errorf("Ready() warns with 10 clients: %q", w)
		}
	}
}
