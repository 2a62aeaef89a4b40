// File-descriptor budget: at startup mongobouncer raises its soft
// RLIMIT_NOFILE to the hard limit, and says (in the log at startup and
// reload, and in /readyz) when max_client_conn cannot fit under it.
//
// Every client connection is a socket, every pooled upstream connection
// another, and each server also has its monitoring connections; a client
// past the limit fails in accept, which a driver sees as a refused or reset
// connection with nothing in mongobouncer's own logs to explain it. Naming
// the limit up front turns that into a configuration message.
package app

import (
	"fmt"
	"log/slog"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

// fdMargin is the descriptors kept for what is neither a client nor an
// upstream socket: the event loop's epoll or io_uring descriptors (one or
// two per loop thread), the admin listener's clients, DNS look-ups, the
// configuration file on reload, standard streams.
const fdMargin = 64

// srvHostsGuess is how many servers a mongodb+srv:// route is counted for
// when srvMaxHosts does not say: the size of a usual replica set. The real
// count is only known once the SRV records are resolved.
const srvHostsGuess = 3

// monitorConnsPerServer are the connections a server's monitoring holds
// besides its pool: the streaming monitor and the RTT monitor.
const monitorConnsPerServer = 2

// FDBudget is what cfg needs in file descriptors, and what the limit allows.
type FDBudget struct {
	// Limit is the soft RLIMIT_NOFILE in force (0: unknown, not checked).
	Limit uint64
	// Clients is max_client_conn (0: no cap).
	Clients int
	// Upstream counts pooled and monitoring connections at their most.
	Upstream int
	// Fixed counts listeners and fdMargin.
	Fixed int
}

// Need is the descriptors cfg may hold at its peak; with no client cap,
// what it needs without clients.
func (b FDBudget) Need() uint64 { return uint64(b.Clients + b.Upstream + b.Fixed) }

// ClientsThatFit is how many clients the limit leaves room for.
func (b FDBudget) ClientsThatFit() int {
	rest := int64(b.Limit) - int64(b.Upstream+b.Fixed)
	return int(max(rest, 0))
}

// Short reports that max_client_conn cannot be held: it is capped and more
// than fits, or uncapped and the limit is known.
func (b FDBudget) Short() bool {
	return b.Limit > 0 && b.Clients > 0 && b.Need() > b.Limit
}

// Warning is the line the log and /readyz carry when Short.
func (b FDBudget) Warning() string {
	return fmt.Sprintf("warning: max_client_conn = %d needs about %d open files (clients, %d upstream and monitoring connections, %d listeners and spare), the open-file limit is %d: about %d clients fit; raise LimitNOFILE (docs/operations.md) or lower max_client_conn",
		b.Clients, b.Need(), b.Upstream, b.Fixed, b.Limit, b.ClientsThatFit())
}

// fdBudget computes cfg's budget against limit. A route's pool is counted
// at max_pool_size per server; with no pool cap, as many as the clients (a
// transaction-mode pool can hold one per client), or nothing more when
// clients are not capped either.
func fdBudget(cfg config.Config, routes []config.EffectiveRoute, limit uint64) FDBudget {
	b := FDBudget{Limit: limit, Clients: cfg.Global.MaxClientConn}
	listeners := 1
	if cfg.Global.AdminListen != "" {
		listeners++
	}
	for _, er := range routes {
		if er.Listen != "" {
			listeners++
		}
		servers := len(er.Conn.Hosts)
		if er.Conn.SRV {
			servers = srvHostsGuess
			if er.Conn.SRVMaxHosts > 0 {
				servers = er.Conn.SRVMaxHosts
			}
		}
		pool := limitsOf(er).MaxPoolSize
		if pool == 0 {
			pool = b.Clients
		}
		b.Upstream += servers * (pool + monitorConnsPerServer)
	}
	b.Fixed = listeners + fdMargin
	return b
}

// checkFDs logs cfg's file-descriptor budget against the limit in force:
// a warning when max_client_conn cannot fit, else one line at info.
func checkFDs(log *slog.Logger, b FDBudget) {
	switch {
	case b.Limit == 0:
	case b.Short():
		log.Warn("max_client_conn exceeds what the open-file limit can hold", "max_client_conn", b.Clients,
			"need", b.Need(), "limit", b.Limit, "clients_that_fit", b.ClientsThatFit(), "detail", b.Warning())
	case b.Clients == 0:
		log.Info("max_client_conn = 0 (no cap): the open-file limit caps clients", "limit", b.Limit,
			"clients_that_fit", b.ClientsThatFit())
	default:
		log.Info("open-file budget", "max_client_conn", b.Clients, "need", b.Need(), "limit", b.Limit)
	}
}
