// The rescan of a mongos list (polling-srv-records-for-mongos-discovery.md):
// one goroutine per SRV host name that re-resolves it and reports changes.

package srv

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// Defaults of PollOptions.
const (
	// DefaultRescanInterval is the spec's rescanSRVIntervalMS when record
	// TTLs cannot be read, which is always the case through *net.Resolver.
	DefaultRescanInterval = 60 * time.Second
	// DefaultRetryInterval is heartbeatFrequencyMS's default, the spec's
	// rescan interval while DNS gives no usable answer.
	DefaultRetryInterval = 10 * time.Second
	// DefaultLookupTimeout bounds one rescan's DNS query, and so how long
	// Close may wait for one; it matches resolv.conf's default per-try
	// timeout.
	DefaultLookupTimeout = 5 * time.Second
)

// PollOptions configure a Poller.
type PollOptions struct {
	// Options are the srvServiceName and srvMaxHosts of the connection
	// string, the same as given to Resolve.
	Options
	// Interval is rescanSRVIntervalMS, counted from the end of the previous
	// lookup; 0 means DefaultRescanInterval.
	Interval time.Duration
	// RetryInterval replaces Interval while lookups fail or return no valid
	// host; the spec says heartbeatFrequencyMS. 0 means DefaultRetryInterval.
	RetryInterval time.Duration
	// Timeout bounds each lookup; 0 means DefaultLookupTimeout.
	Timeout time.Duration
	// Logger receives the rescan's warnings; nil means slog.Default().
	Logger *slog.Logger
	// OnChange, if not nil, is called with the new host list (sorted
	// "host:port", a copy the callee may keep) each time a rescan changes
	// it. It runs on the poller's goroutine, one call at a time; it must
	// not call Close, which waits for that goroutine.
	OnChange func(hosts []string)
}

// Poller rescans the SRV records of one host name while the deployment is
// sharded (or not yet known): the spec forbids it for replica sets, and the
// load balancer spec for loadBalanced=true. It keeps the current list when
// DNS fails or answers with no valid host, never raises an error, and logs
// a failure once when it starts rather than at every attempt.
type Poller struct {
	q      query
	r      Resolver
	o      PollOptions
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	hosts []string
}

// StartPoller starts rescanning host, whose initial seedlist (normally
// Result.Hosts from Resolve) is initial. The first rescan happens
// o.Interval after the call, the spec's "end of the initial DNS seedlist
// discovery". It stops when ctx is done or Close is called. The only errors
// are those of an invalid host name or options (ErrInvalidHost,
// ErrOptionConflict).
func StartPoller(ctx context.Context, r Resolver, host string, initial []string, o PollOptions) (*Poller, error) {
	q, err := newQuery(host, o.Options)
	if err != nil {
		return nil, err
	}
	if o.Interval <= 0 {
		o.Interval = DefaultRescanInterval
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultLookupTimeout
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	hosts := slices.Clone(initial)
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	ctx, cancel := context.WithCancel(ctx)
	p := &Poller{
		q: q, r: r, o: o, cancel: cancel, done: make(chan struct{}), hosts: hosts,
		log: log.With(slog.String("srv_host", q.host)),
	}
	go p.run(ctx)
	return p, nil
}

// Hosts returns the current host list, sorted.
func (p *Poller) Hosts() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.hosts)
}

// Close stops the rescans and waits for the poller's goroutine to end. A
// lookup in progress gets its context cancelled, but *net.Resolver only
// notices its deadline while it waits for a UDP answer, so Close can take
// up to PollOptions.Timeout when DNS is silent. It may be called more than
// once.
func (p *Poller) Close() {
	p.cancel()
	<-p.done
}

// run is the poller's goroutine.
func (p *Poller) run(ctx context.Context) {
	defer close(p.done)
	var (
		failing  bool   // the last rescan gave no usable answer
		rejected string // the rejected targets last logged
	)
	wait := p.o.Interval
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		lctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
		valid, bad, err := p.q.lookupSRV(lctx, p.r)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The spec: drop targets outside the parent domain, without error,
		// and log them with the host name; once per change, not per rescan.
		if msg := errors.Join(bad...); msg == nil {
			rejected = ""
		} else if msg.Error() != rejected {
			rejected = msg.Error()
			p.log.Warn("srv: ignoring SRV records outside the parent domain", slog.String("error", rejected))
		}
		if err == nil && len(valid) == 0 {
			err = errors.Join(bad...)
		}
		if err != nil {
			if !failing {
				p.log.Warn("srv: rescan found no usable SRV records; keeping the current hosts and retrying",
					slog.String("error", err.Error()), slog.Duration("retry_interval", p.o.RetryInterval),
					slog.Int("hosts", len(p.Hosts())))
			} else {
				p.log.Debug("srv: rescan still failing", slog.String("error", err.Error()))
			}
			failing = true
			timer.Reset(p.o.RetryInterval)
			continue
		}
		if failing {
			p.log.Info("srv: rescan succeeded again", slog.Int("valid_hosts", len(valid)))
			failing = false
		}
		p.apply(valid)
		timer.Reset(p.o.Interval)
	}
}

// apply makes valid the new list as the spec says and reports a change.
func (p *Poller) apply(valid []string) {
	p.mu.Lock()
	next := update(p.hosts, valid, p.o.MaxHosts)
	changed := !slices.Equal(next, p.hosts)
	if changed {
		p.hosts = next
	}
	p.mu.Unlock()
	if changed {
		p.log.Info("srv: host list changed", slog.String("hosts", strings.Join(next, ",")))
		if p.o.OnChange != nil {
			p.o.OnChange(slices.Clone(next))
		}
	}
}

// update is one rescan's change to the host list: hosts no longer valid
// go, hosts still valid stay untouched, and new ones come in, all of them
// unless limit (srvMaxHosts) is positive and below the number of valid
// hosts, in which case random new ones are added until the list holds limit.
// The result is sorted; cur and valid are not modified.
func update(cur, valid []string, limit int) []string {
	next := make([]string, 0, len(valid))
	var added []string
	for _, h := range valid {
		if slices.Contains(cur, h) {
			next = append(next, h)
		} else {
			added = append(added, h)
		}
	}
	if limit > 0 && limit < len(valid) {
		rand.Shuffle(len(added), func(i, j int) { added[i], added[j] = added[j], added[i] })
		added = added[:min(len(added), max(0, limit-len(next)))]
	}
	next = append(next, added...)
	slices.Sort(next)
	return next
}
