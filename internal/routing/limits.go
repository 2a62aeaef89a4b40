package routing

// The limits a hello advertises, agreed over every route's servers: a
// client may send any of its requests to any route, so it is told the
// smallest figures of them all, and at startup a hello waits (bounded) for
// every server's first check so that none of them is left out.

import (
	"time"

	"github.com/mongobouncer/mongobouncer/internal/hello"
)

// Limits returns the limits to advertise: the minimum over every server of
// the table's routes that has answered a hello (MongoDB's defaults if none
// has), with maxMessageSizeBytes at most maxMsg (the proxy's own bound).
// settled is false while some server has neither answered a hello nor
// failed a check, so that its figures might still lower the minimum.
func (t *Table) Limits(maxMsg int32) (lim hello.Limits, settled bool) {
	lim = hello.DefaultLimits
	settled = true
	found := false
	for _, r := range t.all {
		for _, srv := range r.Topology.Servers() {
			// Checked first: once it is true, a successful first check's
			// hello is already there to read.
			checked := srv.Checked()
			h := srv.Hello()
			if h == nil {
				if !checked {
					settled = false
				}
				continue
			}
			if !found {
				found = true
				lim = hello.Limits{MinWire: h.MinWireVersion, MaxWire: min(h.MaxWireVersion, hello.MaxWireVersion),
					MaxBSON: h.MaxBSONObjectSize, MaxMsg: h.MaxMessageSizeBytes, MaxBatch: h.MaxWriteBatchSize,
					SessionTimeoutMin: hello.DefaultLimits.SessionTimeoutMin}
				if h.LogicalSessionTimeoutMinutes != nil {
					lim.SessionTimeoutMin = *h.LogicalSessionTimeoutMinutes
				}
				lim.FillZero()
				continue
			}
			lim.MinWire = max(lim.MinWire, h.MinWireVersion)
			lim.MaxWire = min(lim.MaxWire, h.MaxWireVersion)
			lim.MaxBSON = minPositive(lim.MaxBSON, h.MaxBSONObjectSize)
			lim.MaxMsg = minPositive(lim.MaxMsg, h.MaxMessageSizeBytes)
			lim.MaxBatch = minPositive(lim.MaxBatch, h.MaxWriteBatchSize)
			if h.LogicalSessionTimeoutMinutes != nil {
				lim.SessionTimeoutMin = min(lim.SessionTimeoutMin, *h.LogicalSessionTimeoutMinutes)
			}
		}
	}
	lim.MaxMsg = min(lim.MaxMsg, maxMsg)
	return lim, settled
}

// minPositive is the smaller of a and b, b counting only when it is set.
func minPositive(a, b int32) int32 {
	if b > 0 && b < a {
		return b
	}
	return a
}

// WaitLimits returns the table's Limits once settled, waiting up to wait
// or until stop closes, then taking what is known. current returns the
// table in force, read again at each look (a reload may replace it).
// Answering as soon as one route's servers are known could advertise a
// maxWireVersion (or size limit) higher than another route's, which the
// client would then use against it.
func WaitLimits(current func() *Table, maxMsg int32, wait time.Duration, stop <-chan struct{}) hello.Limits {
	lim, settled := current().Limits(maxMsg)
	if settled {
		return lim
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// Polled: a server's first check ends in its monitor, which signals
	// nothing to wait on; this only runs until every server's first check
	// is over.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			lim, _ = current().Limits(maxMsg)
			return lim
		case <-stop:
			lim, _ = current().Limits(maxMsg)
			return lim
		case <-tick.C:
			if lim, settled = current().Limits(maxMsg); settled {
				return lim
			}
		}
	}
}
