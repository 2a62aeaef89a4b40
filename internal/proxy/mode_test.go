package proxy

import (
	"errors"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/routing"
)

// The pool and TLS modes are config's, taken as they are: "" is the
// default (transaction, disable), a mode config does not define is refused
// by New and SetTLS, and SetPoolMode ignores one.
func TestModesAreConfigs(t *testing.T) {
	r := limitsRoute(t, "*", "127.0.0.1:1")
	r.Mode = ""
	s, err := New(Options{Routes: []*routing.Route{r}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(t.Context())
	if m := r.PoolMode(); m != ModeTransaction {
		t.Fatalf(`Mode "": PoolMode %q, want transaction`, m)
	}
	r.SetPoolMode(ModeSession)
	r.SetPoolMode("sessions")
	if m := r.PoolMode(); m != ModeSession {
		t.Fatalf("after an undefined mode: PoolMode %q, want session kept", m)
	}
	if err := s.SetTLS(clienttls.Settings{Mode: "requires"}); !errors.Is(err, clienttls.ErrConfig) {
		t.Fatalf("tls mode requires: %v, want clienttls.ErrConfig", err)
	}
	if err := s.SetTLS(clienttls.Settings{Mode: config.TLSModeDisable}); err != nil {
		t.Fatalf("tls mode disable: %v", err)
	}

	bad := limitsRoute(t, "b", "127.0.0.1:1")
	bad.Mode = "sessions"
	if s, err := New(Options{Routes: []*routing.Route{bad}}); err == nil {
		s.Close(t.Context())
		t.Fatal(`New accepted pool mode "sessions"`)
	}
}
