// The connection probe of a restart measurement: a fresh TCP connection
// and one hello round trip at a steady pace, for the outcome a new client
// meets while proxies restart. The driver workload opens connections only
// when its pools need them; the probe keeps asking, so a listener that
// refuses or resets queued connections during a handover is seen.

package loadgen

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// DialCounts are the probe's outcomes.
type DialCounts struct {
	OK      int `json:"ok"`
	Refused int `json:"refused"`
	Reset   int `json:"reset"`
	// ShutdownInProgress is a hello answered with code 91: the process
	// was draining, and said so.
	ShutdownInProgress int `json:"shutdown_in_progress"`
	Other              int `json:"other"`
	// FirstOther is the first Other error's text.
	FirstOther string `json:"first_other,omitempty"`
}

// Failed is every outcome that is not OK or ShutdownInProgress.
func (c DialCounts) Failed() int { return c.Refused + c.Reset + c.Other }

// DialProbe is a running probe.
type DialProbe struct {
	addr   string
	mu     sync.Mutex
	counts DialCounts // guarded by mu
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// bursts counts the goroutines Burst started, waited for by Stop.
	bursts sync.WaitGroup
}

// maxBurst bounds one Burst.
const maxBurst = 1000

// Burst starts n attempts at once (at most maxBurst) and returns without
// waiting for them: called just before a SIGTERM, some of them are queued
// on the listener as it closes, the connections an upgrade must not reset.
func (p *DialProbe) Burst(n int) {
	if p.ctx.Err() != nil {
		return
	}
	start := make(chan struct{})
	for range min(n, maxBurst) {
		p.bursts.Go(func() {
			<-start
			p.record(probeOnce(p.addr))
		})
	}
	close(start)
}

// probeTimeout bounds one probe's connect and round trip.
const probeTimeout = 5 * time.Second

// maxProbes bounds the probes of one run, besides its context.
const maxProbes = 1_000_000

// StartDialProbe connects to addr every interval (each attempt in a
// goroutine of its own, at most 64 at once) until Stop or ctx ends; an
// interval of 0 makes only the attempts Burst asks for.
func StartDialProbe(ctx context.Context, addr string, interval time.Duration) *DialProbe {
	ctx, cancel := context.WithCancel(ctx)
	p := &DialProbe{addr: addr, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		sem := make(chan struct{}, 64)
		if interval <= 0 {
			<-ctx.Done()
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for range maxProbes {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			select {
			case sem <- struct{}{}:
			default:
				continue // 64 attempts hanging: skip a beat
			}
			wg.Go(func() {
				defer func() { <-sem }()
				p.record(probeOnce(addr))
			})
		}
	}()
	return p
}

// Stop ends the probe and returns its counts.
func (p *DialProbe) Stop() DialCounts {
	p.cancel()
	<-p.done
	p.bursts.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts
}

func (p *DialProbe) record(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ce *CommandError
	switch {
	case err == nil:
		p.counts.OK++
	case errors.As(err, &ce) && ce.Code == 91:
		p.counts.ShutdownInProgress++
	case errors.Is(err, syscall.ECONNREFUSED):
		p.counts.Refused++
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		p.counts.Reset++
	default:
		p.counts.Other++
		if p.counts.FirstOther == "" {
			p.counts.FirstOther = NormalizeErrorText(err.Error())
		}
	}
}

// probeOnce connects to addr, sends a hello and reads its reply.
func probeOnce(addr string) error {
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return err
	}
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, helloBody)); err != nil {
		return err
	}
	msg, err := wire.ReadMessage(bufio.NewReader(c), nil, maxReplySize)
	if err != nil {
		return err
	}
	var m wire.Msg
	if err := wire.ParseMsgInto(msg, &m); err != nil {
		return err
	}
	return replyOK(m.Body)
}
