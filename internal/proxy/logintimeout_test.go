package proxy

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// The decision table of client_login_timeout for a client's goroutine
// (computeDeadline) and for the loop's sweeper (loopClient.loginExpired): which
// deadline holds, from when, and why.
func TestLoginTimeoutRules(t *testing.T) {
	const T = 10 * time.Second
	base := time.Now()
	connected := base.Add(-3 * time.Second)
	convAt := base.Add(-2 * time.Second)
	partAt := base.Add(-time.Second)
	for _, tc := range []struct {
		name                      string
		auth, started, ident, sas bool
		part                      bool
		idle, timeout             time.Duration
		want                      time.Time // zero: no deadline
		byLogin                   bool
		why                       string
	}{
		{name: "first message, auth off", timeout: T, want: connected.Add(T), byLogin: true, why: LoginTimeoutFirstMessage},
		{name: "first message, auth on", auth: true, timeout: T, want: connected.Add(T), byLogin: true, why: LoginTimeoutFirstMessage},
		{name: "auth off after a message", started: true, timeout: T},
		{name: "not logged in: silence from now", auth: true, started: true, timeout: T, want: base.Add(T), byLogin: true, why: LoginTimeoutNotLoggedIn},
		{name: "SASL: from its saslStart", auth: true, started: true, sas: true, timeout: T, want: convAt.Add(T), byLogin: true, why: LoginTimeoutSASL},
		{name: "logged in", auth: true, started: true, ident: true, timeout: T},
		{name: "logged in, idle timeout", auth: true, started: true, ident: true, timeout: T, idle: time.Minute, want: base.Add(time.Minute)},
		{name: "idle timeout shorter than the login rule", auth: true, started: true, timeout: T, idle: time.Second, want: base.Add(time.Second)},
		{name: "partial message, logged in", auth: true, started: true, ident: true, part: true, timeout: T, want: partAt.Add(T), byLogin: true, why: LoginTimeoutPartialMessage},
		{name: "partial message, idle shorter", started: true, part: true, timeout: T, idle: time.Second, want: partAt.Add(time.Second)},
		{name: "partial first message: the first message's deadline", part: true, timeout: T, want: connected.Add(T), byLogin: true, why: LoginTimeoutFirstMessage},
		{name: "off", auth: true, started: true, timeout: 0},
		{name: "off, partial message", started: true, part: true, timeout: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &client{s: &Server{}, connected: connected}
			c.bind()
			if tc.auth {
				c.s.opts.Auth = &ClientAuth{}
			}
			c.s.idleTimeout.Store(int64(tc.idle))
			c.login.clock.started = tc.started
			if tc.ident {
				c.login.ident = &auth.Identity{User: "app", DB: "admin"}
			}
			if tc.sas {
				c.login.conv = &auth.Conversation{}
				c.login.clock.msgAt = convAt
			}
			w := readWait{timeout: tc.timeout, since: base}
			if tc.part {
				w.partAt = partAt
			}
			c.computeDeadline(&w)
			if !w.deadline.Equal(tc.want) || w.byLogin != tc.byLogin || w.why != tc.why {
				t.Fatalf("deadline %v (login %v, %q), want %v (login %v, %q)",
					w.deadline.Sub(base), w.byLogin, w.why, tc.want.Sub(base), tc.byLogin, tc.why)
			}

			// The loop's sweeper, for the same client held idle by the loop
			// since base, a little before and a little after the deadline.
			if !tc.started || tc.idle > 0 {
				return // the goroutine reads first messages; idle is swept apart
			}
			// expired asks the sweeper ago after base. The monotonic clock
			// (lastActive, partAt) starts at the process's start: the sweep
			// is placed in its future rather than the client in its past.
			expired := func(ago time.Duration) string {
				m := monoNow() + time.Hour
				c.lc.lastActive = m
				c.login.clock.convAt = time.Now().Add(-ago - base.Sub(convAt))
				c.lc.Win.Lo, c.lc.Win.Hi, c.login.clock.partAt = 0, 0, 0
				if tc.part {
					c.lc.Win.Hi = 8
					c.login.clock.partAt = m - base.Sub(partAt)
				}
				why, _ := c.lc.loginExpired(m+ago, tc.timeout)
				return why
			}
			if tc.want.IsZero() {
				if why := expired(time.Hour); why != "" {
					t.Fatalf("sweeper closes for %q after an hour", why)
				}
				return
			}
			if why := expired(tc.want.Sub(base) - 100*time.Millisecond); why != "" {
				t.Fatalf("sweeper closes for %q before the deadline", why)
			}
			if why := expired(tc.want.Sub(base) + 100*time.Millisecond); why != tc.why {
				t.Fatalf("sweeper after the deadline: %q, want %q", why, tc.why)
			}
		})
	}
}

// noteConv dates a conversation from the message that began it, once: a
// later message of the same conversation does not move its start.
func TestLoginTimeoutConversationStart(t *testing.T) {
	c := &client{s: &Server{opts: Options{Auth: &ClientAuth{}}}}
	t0 := time.Now()
	c.login.clock.msgAt = t0
	c.login.conv = &auth.Conversation{}
	c.login.noteConv()
	c.login.clock.msgAt = t0.Add(time.Second)
	c.login.noteConv()
	if !c.login.clock.convAt.Equal(t0) {
		t.Fatalf("conversation dated %v, want its saslStart's %v", c.login.clock.convAt.Sub(t0), time.Duration(0))
	}
	c.login.conv = &auth.Conversation{} // a new saslStart
	c.login.noteConv()
	if !c.login.clock.convAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("a new conversation dated %v, want %v", c.login.clock.convAt.Sub(t0), time.Second)
	}
}
