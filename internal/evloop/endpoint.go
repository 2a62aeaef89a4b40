package evloop

// The engine's contract with its user: an Endpoint (one client socket the
// loop may own: its owner, state, read window, and the driver's
// registration) and the Handler the engine calls back with what arrived.
// This file builds everywhere; the loop itself is Linux-only (loop_linux.go).

import "sync"

// State says who owns an endpoint's socket, and what the loop waits for on
// it. The user sets Detached, Idle, Busy and Closed; the engine sets
// AwaitReply (SendRequest) and leaves it (EndReply) for Busy.
type State uint8

const (
	Detached   State = iota // the user's own goroutine reads and writes the socket; the loop ignores it
	Idle                    // the loop owns the endpoint; no request in flight: it waits for the next one
	Busy                    // a request is in the user's hands (waiting for an upstream connection)
	AwaitReply              // a request went out on an Upstream; the loop waits for its reply
	Closed                  // finished
)

// Thread is a loop thread as the engine knows it, handed to every
// callback so that the user's next call (a receive, a fused send) runs on
// the same thread. nil means the call runs off the loop threads: a
// goroutine handing an endpoint to the loop, a checkout delivered after the
// loop stopped. Every loop thread of every driver passes itself.
type Thread interface{ loopThread() }

// Handler is what the engine calls back, always holding the endpoint's Mu
// and only while the event is still wanted (the engine decides that, once:
// Endpoint.wanted). Each call runs under a deferred Recover.
type Handler interface {
	// RequestReceived: the window may hold more of the next request (err
	// nil; maybe nothing new, on readiness alone), or err ends the
	// endpoint's stream (io.EOF for a closed one). State Idle.
	RequestReceived(th Thread, err error)
	// ReplyReceived: n more bytes of the reply are at the start of the
	// buffer passed to RecvReply or SendRequest. State AwaitReply.
	ReplyReceived(th Thread, n int)
	// Failed: the request out on the endpoint's upstream failed, in op
	// ("write" or "read"). State AwaitReply.
	Failed(th Thread, op string, err error)
	// Resumed runs a result the user posted (Loop.Post), under Mu whatever
	// the state.
	Resumed(th Thread, v any, err error)
	// Recover is deferred after Mu's deferred unlock by every engine
	// function that takes Mu on the loop's behalf: it calls recover()
	// itself, so a panic of the user's code ends that endpoint only.
	Recover()
}

// Endpoint is one socket the loop may own. Mu guards everything here; the
// loop threads, the user's goroutine at its hand-overs, and whoever closes
// the endpoint take it before they act. Make it with Init; its zero value
// is a Detached endpoint with no registration.
type Endpoint struct {
	Mu    sync.Mutex
	State State
	// Win is the read window: bytes received but not yet consumed. The
	// owner (the user's goroutine while Detached, else the loop thread
	// holding Mu) alone reads and writes it.
	Win Window

	h Handler
	// reg is the driver's registration, nil until Attach and after Close.
	reg registration
	lp  loopPart
}

// Init sets the handler the engine calls back.
func (ep *Endpoint) Init(h Handler) { ep.h = h }

// Registered reports whether the endpoint's socket is registered with a
// loop (Attach), under Mu.
func (ep *Endpoint) Registered() bool { return ep.reg != nil }
