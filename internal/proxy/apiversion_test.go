package proxy

// A hello's apiVersion field, checked for its type as mongos checks it.

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A hello whose apiVersion is not a string is refused with TypeMismatch,
// as a server refuses it, rather than accepted as if it were absent; a
// string other than "1" still gets APIVersionError, and "1" is accepted.
func TestHelloAPIVersionType(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	cl := limitsProxy(t, 5*time.Second, limitsRoute(t, "*", up.Addr()))
	cases := []struct {
		apiVersion any
		code       int32 // 0: accepted
		msg        string
	}{
		{int32(1), 14, "wrong type 'int', expected type 'string'"},
		{1.0, 14, "wrong type 'double'"},
		{int64(1), 14, "wrong type 'long'"},
		{bson.D{}, 14, "wrong type 'object'"},
		{nil, 14, "wrong type 'null'"},
		{"2", 322, `API version "2"`},
		{"1", 0, ""},
	}
	for _, tc := range cases {
		r := cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "apiVersion", Value: tc.apiVersion}, {Key: "$db", Value: "admin"}})
		ok := r.Lookup("ok").AsFloat64()
		code, _ := r.Lookup("code").Int32OK()
		msg, _ := r.Lookup("errmsg").StringValueOK()
		if tc.code == 0 {
			if ok != 1 {
				t.Errorf("apiVersion %v: %v, want accepted", tc.apiVersion, r)
			}
			continue
		}
		if ok != 0 || code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("apiVersion %#v: %v, want code %d with %q", tc.apiVersion, r, tc.code, tc.msg)
		}
	}
}
