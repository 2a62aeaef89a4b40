package command

// Legacy OP_QUERY commands: translation, refusals and the OP_REPLY framing.

import (
	"bytes"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// TestLegacyCommandReadPreference checks the translation of OP_QUERY
// commands against server-selection.md's rules for OP_QUERY to a mongos:
// the $readPreference modifier wins; without it SecondaryOk means
// secondaryPreferred; with neither the command carries none (primary).
func TestLegacyCommandReadPreference(t *testing.T) {
	find := bson.D{{Key: "find", Value: "c"}, {Key: "filter", Value: bson.D{}}}
	secondaryWest := bson.D{{Key: "mode", Value: "secondary"}, {Key: "tags", Value: bson.A{bson.D{{Key: "dc", Value: "west"}}}}}
	for _, tc := range []struct {
		name   string
		flags  int32
		query  bson.D
		wantRP bson.D // nil: no $readPreference
		want   bson.D // the command's own fields, in order
	}{
		{name: "no flag, no modifier", query: find, want: find},
		{name: "SecondaryOk alone", flags: querySecondaryOk, query: find, wantRP: bson.D{{Key: "mode", Value: "secondaryPreferred"}}, want: find},
		{name: "modifier", flags: querySecondaryOk,
			query:  bson.D{{Key: "$query", Value: find}, {Key: "$readPreference", Value: secondaryWest}},
			wantRP: secondaryWest, want: find},
		{name: "modifier without the flag", query: bson.D{{Key: "$query", Value: find}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "nearest"}}}},
			wantRP: bson.D{{Key: "mode", Value: "nearest"}}, want: find},
		{name: "$query without modifier", query: bson.D{{Key: "$query", Value: find}}, want: find},
		{name: "$query without modifier, SecondaryOk", flags: querySecondaryOk, query: bson.D{{Key: "$query", Value: find}},
			wantRP: bson.D{{Key: "mode", Value: "secondaryPreferred"}}, want: find},
		{name: "the command's own $db is replaced by the namespace's",
			query: bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "other"}}, want: bson.D{{Key: "ping", Value: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := wire.AppendQuery(nil, 42, tc.flags, "db.$cmd", 0, -1, mustDoc(t, tc.query))
			pq, err := wire.ParseQuery(q)
			if err != nil {
				t.Fatal(err)
			}
			m, err := LegacyCommand(nil, pq, "db")
			if err != nil {
				t.Fatal(err)
			}
			msg, err := wire.ParseMsg(m)
			if err != nil {
				t.Fatalf("not a valid OP_MSG: %v", err)
			}
			if msg.Header.RequestID != 42 || msg.Flags != 0 {
				t.Fatalf("request ID %d flags %v, want 42 and none", msg.Header.RequestID, msg.Flags)
			}
			want := append(bson.D{}, tc.want...)
			want = append(want, bson.E{Key: "$db", Value: "db"})
			if tc.wantRP != nil {
				want = append(want, bson.E{Key: "$readPreference", Value: tc.wantRP})
			}
			if !bytes.Equal(msg.Body, mustDoc(t, want)) {
				t.Fatalf("body %v, want %v", msg.Body, bsoncore.Document(mustDoc(t, want)))
			}
			// The translated command reads as the OP_MSG one would.
			var r Request
			r.Inspect(msg.Body)
			if string(r.DB) != "db" || (tc.wantRP != nil) != (r.ReadPref != nil) {
				t.Fatalf("inspected db %q, read preference %v", r.DB, r.ReadPref)
			}
		})
	}
}

func TestLegacyCommandRefusals(t *testing.T) {
	ping := mustDoc(t, bson.D{{Key: "ping", Value: 1}})
	q, _ := wire.ParseQuery(wire.AppendQuery(nil, 1, queryExhaust, "db.$cmd", 0, -1, ping))
	if _, err := LegacyCommand(nil, q, "db"); !errors.Is(err, ErrLegacyExhaust) {
		t.Fatalf("exhaust flag: %v, want ErrLegacyExhaust", err)
	}
	q, _ = wire.ParseQuery(wire.AppendQuery(nil, 1, 0, "db.$cmd", 0, -1, mustDoc(t, bson.D{{Key: "$query", Value: 1}})))
	if _, err := LegacyCommand(nil, q, "db"); err == nil {
		t.Fatal("a $query that is not a document was accepted")
	}
	q, _ = wire.ParseQuery(wire.AppendQuery(nil, 1, 0, "db.$cmd", 0, -1, mustDoc(t, bson.D{})))
	if _, err := LegacyCommand(nil, q, "db"); err == nil {
		t.Fatal("an empty command was accepted")
	}
	for ns, want := range map[string]string{"db.$cmd": "db", "admin.$cmd": "admin", "db.c": "", ".$cmd": "", "a.b.$cmd": "", "$cmd": ""} {
		if got := LegacyDatabase(ns); got != want {
			t.Errorf("LegacyDatabase(%q) = %q, want %q", ns, got, want)
		}
	}
}

func TestLegacyReply(t *testing.T) {
	body := mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: int32(13)}})
	r := LegacyReply(nil, wire.AppendMsg(nil, 9, 42, 0, body))
	h, _ := wire.ParseHeader(r)
	rep, err := wire.ParseReply(r)
	if err != nil {
		t.Fatal(err)
	}
	if h.OpCode != wire.OpReply || h.RequestID != 9 || h.ResponseTo != 42 || len(rep.Documents) != 1 || !bytes.Equal(rep.Documents[0], body) {
		t.Fatalf("got %v %+v, want an OP_REPLY 9 answering 42 with the body", h, rep)
	}
	if rep.ResponseFlags&wire.ReplyQueryFailure != 0 {
		t.Fatal("a command's failure is its ok: 0, not QueryFailure")
	}
	// A reply that is not an OP_MSG becomes an error document.
	r = LegacyReply(nil, []byte{1, 2, 3})
	rep, err = wire.ParseReply(r)
	if err != nil || len(rep.Documents) != 1 {
		t.Fatalf("broken reply translated to %v, %v", rep, err)
	}
	if code, _ := rep.Documents[0].Lookup("code").AsInt64OK(); code != 17 {
		t.Fatalf("broken reply translated to %v", rep.Documents[0])
	}
}

// checkLegacy is FuzzRequestParsers' check of the translation: any valid
// command document, with any flags, becomes a valid OP_MSG or an error,
// and the OP_MSG's reply translation carries the body unchanged.
func checkLegacy(t *testing.T, b []byte) {
	flags := int32(0)
	if len(b)%2 == 1 {
		flags |= querySecondaryOk
	}
	if len(b)%7 == 0 {
		flags |= queryExhaust
	}
	q, err := wire.ParseQuery(wire.AppendQuery(nil, 5, flags, "d.$cmd", 0, -1, b))
	if err != nil {
		return
	}
	m, err := LegacyCommand(nil, q, "d")
	if err != nil {
		return
	}
	msg, err := wire.ParseMsg(m)
	if err != nil {
		t.Fatalf("translated to an invalid OP_MSG: %v", err)
	}
	var r Request
	r.Inspect(msg.Body)
	if string(r.DB) != "d" {
		t.Fatalf("translated command has $db %q", r.DB)
	}
	rep, err := wire.ParseReply(LegacyReply(nil, m))
	if err != nil || len(rep.Documents) != 1 || !bytes.Equal(rep.Documents[0], msg.Body) {
		t.Fatalf("reply translation: %v, %v", rep, err)
	}
	_ = LegacyReply(nil, b)
}
