package gate

import (
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// TestUsersCount: the cap counts per user (a name and its database), a
// release frees a place, and SetMax changes the cap live.
func TestUsersCount(t *testing.T) {
	u := &Users{}
	u.SetMax(2)
	bob, bobOther := auth.UserID{User: "bob", DB: "admin"}, auth.UserID{User: "bob", DB: "shop"}
	for i := range 2 {
		if ok, _ := u.Acquire(bob); !ok {
			t.Fatalf("login %d of bob refused", i+1)
		}
	}
	if ok, limit := u.Acquire(bob); ok || limit != 2 {
		t.Fatalf("third login of bob: %v (limit %d)", ok, limit)
	}
	if ok, _ := u.Acquire(bobOther); !ok {
		t.Fatal("bob of another database counted as the same user")
	}
	u.Release(bob)
	if u.Count(bob) != 1 {
		t.Fatalf("count %d after a release", u.Count(bob))
	}
	if ok, _ := u.Acquire(bob); !ok {
		t.Fatal("a released place is not free")
	}
	u.SetMax(3)
	if ok, _ := u.Acquire(bob); !ok {
		t.Fatal("a raised cap is not applied")
	}
	u.SetMax(0)
	for range 10 {
		if ok, _ := u.Acquire(bob); !ok {
			t.Fatal("0 is no cap")
		}
	}
	for range 13 {
		u.Release(bob)
	}
	if n := u.users(); n != 1 {
		t.Fatalf("%d entries left, want bobOther's only", n)
	}
	u.Refuse()
	if u.Refused() != 1 {
		t.Fatalf("refused %d, want 1", u.Refused())
	}
}
