package proxy

import (
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// TestUserClientsCount: the cap counts per user (a name and its database),
// a release frees a place, and SetUserClientLimit changes the cap live.
func TestUserClientsCount(t *testing.T) {
	s := &Server{}
	s.SetUserClientLimit(2)
	bob, bobOther := auth.UserID{User: "bob", DB: "admin"}, auth.UserID{User: "bob", DB: "shop"}
	u := &s.userClients
	for i := range 2 {
		if ok, _ := u.acquire(bob); !ok {
			t.Fatalf("login %d of bob refused", i+1)
		}
	}
	if ok, limit := u.acquire(bob); ok || limit != 2 {
		t.Fatalf("third login of bob: %v (limit %d)", ok, limit)
	}
	if ok, _ := u.acquire(bobOther); !ok {
		t.Fatal("bob of another database counted as the same user")
	}
	u.release(bob)
	if s.UserClientCount(bob) != 1 {
		t.Fatalf("count %d after a release", s.UserClientCount(bob))
	}
	if ok, _ := u.acquire(bob); !ok {
		t.Fatal("a released place is not free")
	}
	s.SetUserClientLimit(3)
	if ok, _ := u.acquire(bob); !ok {
		t.Fatal("a raised cap is not applied")
	}
	s.SetUserClientLimit(0)
	for range 10 {
		if ok, _ := u.acquire(bob); !ok {
			t.Fatal("0 is no cap")
		}
	}
	for range 13 {
		u.release(bob)
	}
	if n := len(u.n); n != 1 {
		t.Fatalf("%d entries left, want bobOther's only", n)
	}
}
