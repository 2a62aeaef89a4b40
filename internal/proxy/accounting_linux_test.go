package proxy

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// countingObserver counts the upstream errors reported.
type countingObserver struct {
	nopObserver
	upstreamErrors atomic.Int64
}

func (o *countingObserver) UpstreamError(string, int32) { o.upstreamErrors.Add(1) }

// A moreToCome request that cannot reach its upstream gets no error reply,
// so no error code is reported for it either: UpstreamError counts the
// codes clients were answered with.
func TestMoreToComeFailureReportsNoUpstreamError(t *testing.T) {
	r := newLoopRig(t, LoopIOEpoll, 1, func(req *fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	obs := &countingObserver{}
	r.s.opts.Observer = obs
	cl := r.client(0)
	affOK(t, cl.cmd(ping()))
	// Paused, the pool fails every checkout at once.
	r.route.Topology.Servers()[0].Pool().Clear(false)
	body := mustDoc(t, ping())
	_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	msgs := wire.AppendMsg(nil, 50, 0, wire.FlagMoreToCome, body)
	msgs = wire.AppendMsg(msgs, 51, 0, 0, body)
	if _, err := cl.c.Write(msgs); err != nil {
		t.Fatal(err)
	}
	rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := wire.ParseHeader(rep); h.ResponseTo != 51 {
		t.Fatalf("a reply to %d, want one to 51 only", h.ResponseTo)
	}
	if n := obs.upstreamErrors.Load(); n != 1 {
		t.Fatalf("%d upstream errors reported, want 1 (the reply to 51)", n)
	}
}
