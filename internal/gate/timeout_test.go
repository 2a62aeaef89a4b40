package gate

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// The decision table of client_login_timeout for a client's goroutine
// (Wait.Compute) and for the loop's sweeper (Clock.Expired): which
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
		{name: "first message, auth off", timeout: T, want: connected.Add(T), byLogin: true, why: TimeoutFirstMessage},
		{name: "first message, auth on", auth: true, timeout: T, want: connected.Add(T), byLogin: true, why: TimeoutFirstMessage},
		{name: "auth off after a message", started: true, timeout: T},
		{name: "not logged in: silence from now", auth: true, started: true, timeout: T, want: base.Add(T), byLogin: true, why: TimeoutNotLoggedIn},
		{name: "SASL: from its saslStart", auth: true, started: true, sas: true, timeout: T, want: convAt.Add(T), byLogin: true, why: TimeoutSASL},
		{name: "logged in", auth: true, started: true, ident: true, timeout: T},
		{name: "logged in, idle timeout", auth: true, started: true, ident: true, timeout: T, idle: time.Minute, want: base.Add(time.Minute)},
		{name: "idle timeout shorter than the login rule", auth: true, started: true, timeout: T, idle: time.Second, want: base.Add(time.Second)},
		{name: "partial message, logged in", auth: true, started: true, ident: true, part: true, timeout: T, want: partAt.Add(T), byLogin: true, why: TimeoutPartialMessage},
		{name: "partial message, idle shorter", started: true, part: true, timeout: T, idle: time.Second, want: partAt.Add(time.Second)},
		{name: "partial first message: the first message's deadline", part: true, timeout: T, want: connected.Add(T), byLogin: true, why: TimeoutFirstMessage},
		{name: "off", auth: true, started: true, timeout: 0},
		{name: "off, partial message", started: true, part: true, timeout: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &Clock{Connected: connected, Started: tc.started}
			pending := tc.auth && !tc.ident
			var conv *auth.Conversation
			if tc.sas {
				conv = &auth.Conversation{}
				k.MsgAt = convAt
			}
			w := Wait{Timeout: tc.timeout, Since: base}
			if tc.part {
				w.PartAt = partAt
			}
			w.Compute(time.Now(), tc.idle, k, pending, conv)
			if !w.Deadline.Equal(tc.want) || w.ByLogin != tc.byLogin || w.Why != tc.why {
				t.Fatalf("deadline %v (login %v, %q), want %v (login %v, %q)",
					w.Deadline.Sub(base), w.ByLogin, w.Why, tc.want.Sub(base), tc.byLogin, tc.why)
			}
			if w.ByLogin {
				// How long a close at the deadline says the client waited:
				// from what the reason counts from.
				from := map[string]time.Time{TimeoutFirstMessage: connected, TimeoutSASL: convAt,
					TimeoutPartialMessage: partAt, TimeoutNotLoggedIn: base}[w.Why]
				if got := w.Waited(w.Deadline, k); got != w.Deadline.Sub(from) {
					t.Fatalf("waited %v at the deadline, want %v", got, w.Deadline.Sub(from))
				}
			}

			// The loop's sweeper, for the same client held idle by the loop
			// since base, a little before and a little after the deadline.
			if !tc.started || tc.idle > 0 {
				return // the goroutine reads first messages; idle is swept apart
			}
			// expired asks the sweeper ago after base, on a monotonic clock
			// where the client was last active at mono.
			const mono = time.Hour
			expired := func(ago time.Duration) string {
				k.PartAt = 0
				if tc.part {
					k.PartAt = mono - base.Sub(partAt)
				}
				why, _ := k.Expired(pending, conv, tc.part, mono+ago, mono, base.Add(ago), tc.timeout)
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

// NoteConv dates a conversation from the message that began it, once: a
// later message of the same conversation does not move its start; a
// login forgets it.
func TestLoginTimeoutConversationStart(t *testing.T) {
	var k Clock
	t0 := time.Now()
	k.Message(t0, true)
	conv := &auth.Conversation{}
	k.NoteConv(conv)
	k.Message(t0.Add(time.Second), true)
	k.NoteConv(conv)
	if !k.ConvAt.Equal(t0) {
		t.Fatalf("conversation dated %v, want its saslStart's %v", k.ConvAt.Sub(t0), time.Duration(0))
	}
	k.NoteConv(&auth.Conversation{}) // a new saslStart
	if !k.ConvAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("a new conversation dated %v, want %v", k.ConvAt.Sub(t0), time.Second)
	}
	k.LoggedIn()
	if !k.ConvAt.IsZero() {
		t.Fatal("a logged-in client keeps its conversation's start")
	}
	k.Message(t0.Add(2*time.Second), false)
	if !k.MsgAt.Equal(t0.Add(time.Second)) {
		t.Fatal("a message after the login is dated: only pre-login messages are")
	}
}

// NotePartial dates the start of a partial message once, and forgets it
// when the window is empty.
func TestNotePartial(t *testing.T) {
	var k Clock
	k.NotePartial(3, time.Second)
	k.NotePartial(9, 2*time.Second)
	if k.PartAt != time.Second {
		t.Fatalf("partial message dated %v, want its first bytes' 1s", k.PartAt)
	}
	k.NotePartial(0, 3*time.Second)
	if k.PartAt != 0 {
		t.Fatal("an empty window keeps a partial message's start")
	}
}
