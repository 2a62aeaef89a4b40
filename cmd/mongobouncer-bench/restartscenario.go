// The two scenarios of mongobouncer-bench restart: rolling (two instances
// behind HAProxy, each restarted in turn, as a Deployment's pods behind a
// Service) and upgrade (one address shared with so_reuseport, a new
// process started beside the old one before the old one is stopped,
// docs/operations.md "Upgrade on one host").

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
)

// scenario is a set of running mongobouncer processes the load goes
// through, and the way one of them is replaced.
type scenario interface {
	// address is where the application connects.
	address() string
	// restart replaces one process (step i of the run), calling
	// beforeTerm just before it sends the SIGTERM, and returns how the
	// old one stopped.
	restart(ctx context.Context, i int, beforeTerm func()) (exitInfo, error)
	// close stops everything still running.
	close()
	// adminAddrs are the admin listeners (diagnostics: restartstuck.go).
	adminAddrs() []string
}

// balancerSettle is how long HAProxy needs to mark freshly started servers
// up: rise 2 checks, 500 ms apart (loadgen.BalancerConfig), and a margin.
const balancerSettle = 1500 * time.Millisecond

// exitLimit is how long a SIGTERMed mongobouncer may take to exit.
func (o restartOpts) exitLimit() time.Duration {
	if o.shutdownTimeout > 0 {
		return o.shutdownDelay + o.shutdownTimeout + exitGrace
	}
	return o.shutdownDelay + defaultShutdownTimeout + exitGrace
}

// rolling is two instances behind HAProxy.
type rolling struct {
	o      restartOpts
	cfgs   [2]string
	admins [2]string
	inst   [2]*bouncer
	gen    [2]int
	hap    *loadgen.HAProxy
}

func startRolling(ctx context.Context, o restartOpts, dir, upstream string) (s scenario, err error) {
	r := &rolling{o: o}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	var servers []loadgen.BalancerServer
	for k := range 2 {
		listen, err := freeAddr()
		if err != nil {
			return nil, err
		}
		if r.admins[k], err = freeAddr(); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("b%d", k)
		r.cfgs[k], err = writeConfig(dir, name, bouncerConfig{listen: listen, admin: r.admins[k], upstream: upstream,
			shutdownTimeout: o.shutdownTimeout, shutdownDelay: o.shutdownDelay, eventLoop: o.eventLoop})
		if err != nil {
			return nil, err
		}
		if r.inst[k], err = startBouncer(o.bin, name+".1", r.cfgs[k], r.admins[k], o.log); err != nil {
			return nil, err
		}
		r.gen[k] = 1
		o.logger.Info("started", "name", name+".1", "pid", r.inst[k].pid(), "admin", r.admins[k], "listen", listen)
		servers = append(servers, loadgen.BalancerServer{Addr: listen, Check: r.admins[k]})
	}
	for _, b := range r.inst {
		if err := b.waitReady(ctx); err != nil {
			return nil, err
		}
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	if r.hap, err = loadgen.StartHAProxy(ctx, loadgen.HAProxyOptions{Binary: o.haproxyBin, Listen: listen,
		Config: loadgen.BalancerConfig(listen, servers)}); err != nil {
		return nil, err
	}
	sleepCtx(ctx, balancerSettle)
	return r, ctx.Err()
}

func (r *rolling) address() string { return r.hap.Addr() }

func (r *rolling) adminAddrs() []string { return r.admins[:] }

// restart stops instance i%2 (SIGTERM, wait for its exit), starts it
// again on the same configuration and waits for its /readyz.
func (r *rolling) restart(ctx context.Context, i int, beforeTerm func()) (exitInfo, error) {
	k := i % 2
	old := r.inst[k]
	beforeTerm()
	r.o.logger.Info("SIGTERM", "name", old.name, "pid", old.pid(), "admin", r.admins[k])
	code, took, killed := old.terminate(r.o.exitLimit())
	ex := exitInfo{Name: old.name, Code: code, Drain: took, Killed: killed}
	r.o.logger.Info("exited", "name", old.name, "pid", old.pid(), "code", code)
	r.gen[k]++
	nb, err := startBouncer(r.o.bin, fmt.Sprintf("b%d.%d", k, r.gen[k]), r.cfgs[k], r.admins[k], r.o.log)
	if err != nil {
		r.inst[k] = nil
		return ex, err
	}
	r.inst[k] = nb
	err = nb.waitReady(ctx)
	r.o.logger.Info("ready", "name", nb.name, "pid", nb.pid(), "admin", r.admins[k])
	return ex, err
}

func (r *rolling) close() {
	if r.hap != nil {
		r.hap.Stop()
	}
	for _, b := range r.inst {
		if b != nil {
			b.terminate(exitGrace)
		}
	}
}

// upgrade is one address served by one process at a time, two during a
// handover, with so_reuseport.
type upgrade struct {
	o      restartOpts
	cfg    string
	listen string
	admin  string
	cur    *bouncer
	gen    int
}

func startUpgrade(ctx context.Context, o restartOpts, dir, upstream string) (s scenario, err error) {
	u := &upgrade{o: o}
	defer func() {
		if err != nil {
			u.close()
		}
	}()
	if u.listen, err = freeAddr(); err != nil {
		return nil, err
	}
	if u.admin, err = freeAddr(); err != nil {
		return nil, err
	}
	if u.cfg, err = writeConfig(dir, "mongobouncer", bouncerConfig{listen: u.listen, admin: u.admin, upstream: upstream,
		reusePort: true, shutdownTimeout: o.shutdownTimeout, shutdownDelay: o.shutdownDelay, eventLoop: o.eventLoop}); err != nil {
		return nil, err
	}
	u.gen = 1
	if u.cur, err = startBouncer(o.bin, "p1", u.cfg, u.admin, o.log); err != nil {
		return nil, err
	}
	return u, u.cur.waitReady(ctx)
}

func (u *upgrade) address() string { return u.listen }

func (u *upgrade) adminAddrs() []string { return []string{u.admin} }

// restart starts a new process on the same configuration (so the same
// addresses), waits for its own /readyz, then SIGTERMs the old one and
// waits for its exit: the procedure of docs/operations.md.
func (u *upgrade) restart(ctx context.Context, _ int, beforeTerm func()) (exitInfo, error) {
	u.gen++
	nb, err := startBouncer(u.o.bin, fmt.Sprintf("p%d", u.gen), u.cfg, u.admin, u.o.log)
	if err != nil {
		return exitInfo{}, err
	}
	if err := nb.waitReady(ctx); err != nil {
		nb.terminate(exitGrace)
		return exitInfo{}, err
	}
	old := u.cur
	u.cur = nb
	beforeTerm()
	code, took, killed := old.terminate(u.o.exitLimit())
	return exitInfo{Name: old.name, Code: code, Drain: took, Killed: killed}, nil
}

func (u *upgrade) close() {
	if u.cur != nil {
		u.cur.terminate(exitGrace)
	}
}
