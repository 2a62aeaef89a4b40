package auth

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The user name of a client-first message is measured unescaped, past an
// authzid, before any lookup.
func TestScramUserLen(t *testing.T) {
	for _, tc := range []struct {
		c1   string
		want int
	}{
		{"n,,n=alice,r=abc", 5},
		{"n,a=x,n=12345,r=n", 5},
		{"n,,n=a=2Cb=3Dc,r=n", 5},
		{"n,,r=abc", 0},
		{"garbage", 0},
	} {
		if got := scramUserLen([]byte(tc.c1)); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.c1, got, tc.want)
		}
	}
}

// LogName keeps at most LogNameLen bytes of a name, with the length.
func TestLogName(t *testing.T) {
	if got := LogName("app"); got != "app" {
		t.Fatalf("short name %q", got)
	}
	long := strings.Repeat("u", 5000)
	if got := LogName(long); len(got) > LogNameLen+32 || !strings.Contains(got, "5000 bytes") {
		t.Fatalf("long name logged as %q", got)
	}
}

func doc(t *testing.T, f func(d []byte) []byte) bsoncore.Document {
	t.Helper()
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = f(d)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// The X.509 step: the mechanism and database it takes, a verified
// certificate with a subject, the user named being that subject, and one
// identity per connection.
func TestLoginX509(t *testing.T) {
	body := func(mech, user string) bsoncore.Document {
		return doc(t, func(d []byte) []byte {
			d = bsoncore.AppendInt32Element(d, "authenticate", 1)
			d = bsoncore.AppendStringElement(d, "mechanism", mech)
			if user != "" {
				d = bsoncore.AppendStringElement(d, "user", user)
			}
			return d
		})
	}
	const subj = "CN=app,O=shop"
	for _, tc := range []struct {
		name        string
		mech, user  string
		db, subject string
		hasCert, on bool
		code        int32 // 0: logged in
	}{
		{"off", MechX509, "", ExternalDB, subj, true, false, 334},
		{"SCRAM named", "SCRAM-SHA-256", "", ExternalDB, subj, true, true, 334},
		{"wrong database", MechX509, "", "admin", subj, true, true, 2},
		{"no certificate", MechX509, "", ExternalDB, "", false, true, 18},
		{"empty subject", MechX509, "", ExternalDB, "", true, true, 18},
		{"subject too long", MechX509, "", ExternalDB, strings.Repeat("x", MaxUserName+1), true, true, 18},
		{"another user", MechX509, "CN=other", ExternalDB, subj, true, true, 18},
		{"ok", MechX509, subj, ExternalDB, subj, true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Login
			reply, id, se := l.X509(body(tc.mech, tc.user), tc.db, tc.subject, tc.hasCert, tc.on)
			if tc.code != 0 {
				if se == nil || se.Code != tc.code {
					t.Fatalf("refusal %v, want code %d", se, tc.code)
				}
				return
			}
			if se != nil || id == nil || id.User != subj || id.DB != ExternalDB {
				t.Fatalf("login: %v, %v", id, se)
			}
			if u, _ := reply.Lookup("user").StringValueOK(); u != subj {
				t.Fatalf("reply %v", reply)
			}
			// Logged in: the same subject again is no new identity, another
			// one is refused.
			l.Ident = id
			if _, again, se := l.X509(body(MechX509, ""), ExternalDB, subj, true, true); se != nil || again != nil {
				t.Fatalf("the same subject again: %v, %v", again, se)
			}
			if _, _, se := l.X509(body(MechX509, ""), ExternalDB, "CN=other", true, true); se == nil || se.Code != 18 {
				t.Fatalf("another subject on a logged-in connection: %v", se)
			}
		})
	}
}

// saslContinue without a conversation, or with another conversationId, is
// a protocol error, not an authentication failure.
func TestLoginContinueWithoutConversation(t *testing.T) {
	var l Login
	body := doc(t, func(d []byte) []byte {
		d = bsoncore.AppendInt32Element(d, "saslContinue", 1)
		d = bsoncore.AppendInt32Element(d, "conversationId", 1)
		return bsoncore.AppendBinaryElement(d, "payload", 0, []byte("c=biws"))
	})
	if _, _, se := l.SASLContinue(body); se == nil || se.Code != 17 {
		t.Fatalf("saslContinue with no conversation: %v", se)
	}
}
