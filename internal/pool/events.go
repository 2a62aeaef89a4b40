package pool

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// EventType identifies one of the 11 CMAP events. String returns the spec's name.
type EventType uint8

// The CMAP events.
const (
	PoolCreated EventType = iota + 1
	PoolReady
	PoolCleared
	PoolClosed
	ConnectionCreated
	ConnectionReady
	ConnectionClosed
	ConnectionCheckOutStarted
	ConnectionCheckOutFailed
	ConnectionCheckedOut
	ConnectionCheckedIn
)

var eventNames = [...]string{
	PoolCreated:               "ConnectionPoolCreated",
	PoolReady:                 "ConnectionPoolReady",
	PoolCleared:               "ConnectionPoolCleared",
	PoolClosed:                "ConnectionPoolClosed",
	ConnectionCreated:         "ConnectionCreated",
	ConnectionReady:           "ConnectionReady",
	ConnectionClosed:          "ConnectionClosed",
	ConnectionCheckOutStarted: "ConnectionCheckOutStarted",
	ConnectionCheckOutFailed:  "ConnectionCheckOutFailed",
	ConnectionCheckedOut:      "ConnectionCheckedOut",
	ConnectionCheckedIn:       "ConnectionCheckedIn",
}

// String returns the spec's event name, e.g. "ConnectionPoolCreated".
func (t EventType) String() string {
	if int(t) < len(eventNames) && eventNames[t] != "" {
		return eventNames[t]
	}
	return "UnknownPoolEvent"
}

// Reason is the reason carried by ConnectionClosed and ConnectionCheckOutFailed
// events; the values are the spec's.
type Reason string

// ConnectionClosed reasons.
const (
	// ReasonStale: the pool was cleared after the connection was created.
	ReasonStale Reason = "stale"
	// ReasonIdle: the connection was available for longer than MaxIdleTime (also used
	// when maintenance trims available connections above a lowered MaxPoolSize).
	ReasonIdle Reason = "idle"
	// ReasonError: establishing or using the connection failed (see MarkErrored).
	ReasonError Reason = "error"
	// ReasonPoolClosed: the pool was closed (also a checkout failure reason).
	ReasonPoolClosed Reason = "poolClosed"
)

// ConnectionCheckOutFailed reasons (besides ReasonPoolClosed).
const (
	// ReasonTimeout: WaitQueueTimeout elapsed or the caller's context ended.
	ReasonTimeout Reason = "timeout"
	// ReasonConnectionError: the pool was paused/cleared, or establishing the
	// connection made for this checkout failed.
	ReasonConnectionError Reason = "connectionError"
)

// Counts are connection and waiter counts. Total = Available + Pending + InUse.
type Counts struct {
	Total     int
	Available int
	Pending   int
	InUse     int
	// Waiters are checkouts in the wait queue (not those whose connection is already
	// being established).
	Waiters int
}

// Event is one CMAP event. Fields that do not apply to Type are zero.
type Event struct {
	// Type is the event's kind.
	Type EventType
	// Address is the pool's address (all events).
	Address string
	// ConnectionID is set on ConnectionCreated, Ready, Closed, CheckedOut, CheckedIn.
	ConnectionID int64
	// Generation is the connection's generation on connection events, the pool's (or
	// the service's, in load-balancer mode) new generation on PoolCleared.
	Generation uint64
	// Duration is set on ConnectionReady (created to ready), ConnectionCheckedOut and
	// ConnectionCheckOutFailed (checkout started to this event). A checkout decided
	// without waiting (served from the available connections, or failed at once) reports
	// 0: the pool reads the clock only for checkouts that wait.
	Duration time.Duration
	// Reason is set on ConnectionClosed and ConnectionCheckOutFailed.
	Reason Reason
	// Err is the associated error on ConnectionClosed (reason error) and
	// ConnectionCheckOutFailed.
	Err error
	// ServiceID is set on PoolCleared in load-balancer mode (HasServiceID true).
	ServiceID    bson.ObjectID
	HasServiceID bool
	// InterruptInUseConnections is set on PoolCleared.
	InterruptInUseConnections bool
	// Options is set on PoolCreated: the options the pool was created with. It must not
	// be modified.
	Options *Options
	// Counts are the pool's counts right after the change the event reports
	// (ConnectionCheckedIn and ConnectionReady: right before the connection moves on).
	Counts Counts
}

// Monitor receives pool events.
//
// HandleEvent is called synchronously, with the pool's internal lock held, in exactly
// the order the pool's state changed, and never concurrently for the same pool. That
// makes the event stream linearizable (Counts is a consistent snapshot) and costs no
// allocation, but it means an implementation must be fast, must not block, and must not
// call any method of the Pool that emitted the event (that would deadlock). Hand slow
// work (I/O) to another goroutine.
type Monitor interface {
	HandleEvent(Event)
}

// MonitorFunc adapts a function to Monitor.
type MonitorFunc func(Event)

// HandleEvent calls f(e).
func (f MonitorFunc) HandleEvent(e Event) { f(e) }

type multiMonitor []Monitor

func (m multiMonitor) HandleEvent(e Event) {
	for _, x := range m {
		x.HandleEvent(e)
	}
}

// Monitors fans events out to every non-nil monitor, in argument order. It returns nil
// when none is non-nil, so that a pool without subscribers pays nothing.
func Monitors(ms ...Monitor) Monitor {
	var out multiMonitor
	for _, m := range ms {
		switch x := m.(type) {
		case nil:
		case multiMonitor:
			out = append(out, x...)
		default:
			out = append(out, m)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}
