// A diagnostic of the restart workload: the commands the driver sent that
// have had no reply for a while, reported once each with the driver's
// connection id and the server's (mongobouncer's client id), so that a
// reply lost somewhere between the upstream and the driver can be traced
// while its connection is still open.

package loadgen

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
)

// inflightCmd is one command sent and not yet answered.
type inflightCmd struct {
	name, conn string
	serverConn int64
	requestID  int64
	sent       time.Time
	reported   bool
}

func (c *connCounter) commandStarted(_ context.Context, e *event.CommandStartedEvent) {
	if e.CommandName == "hello" || e.CommandName == "isMaster" {
		return // awaitable hellos wait by design
	}
	ic := &inflightCmd{name: e.CommandName, conn: e.ConnectionID, requestID: e.RequestID, sent: time.Now(), serverConn: -1}
	if e.ServerConnectionID != nil {
		ic.serverConn = *e.ServerConnectionID
	}
	c.imu.Lock()
	c.inflight[e.RequestID] = ic
	c.imu.Unlock()
}

func (c *connCounter) commandSucceeded(_ context.Context, e *event.CommandSucceededEvent) {
	c.done(e.RequestID)
}

func (c *connCounter) done(id int64) {
	c.imu.Lock()
	delete(c.inflight, id)
	c.imu.Unlock()
}

// watchStuck reports each command unanswered after `after` to onStuck,
// until ctx ends.
func (c *connCounter) watchStuck(ctx context.Context, after time.Duration, onStuck func(string)) {
	if after <= 0 {
		after = 3 * time.Second
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var lines []string
		now := time.Now()
		c.imu.Lock()
		for _, ic := range c.inflight {
			if !ic.reported && now.Sub(ic.sent) > after {
				ic.reported = true
				lines = append(lines, fmt.Sprintf("%s requestId=%d conn=%s serverConnectionId=%d sent=%s (%.1f s ago)",
					ic.name, ic.requestID, ic.conn, ic.serverConn, ic.sent.UTC().Format("15:04:05.000"), now.Sub(ic.sent).Seconds()))
			}
		}
		c.imu.Unlock()
		for _, l := range lines {
			onStuck(l)
		}
	}
}
