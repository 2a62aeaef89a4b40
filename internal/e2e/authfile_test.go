package e2e

// The auth_file on reload: a broken line's error and log never print a
// secret, and a file others may read is warned about.

import (
	"os"
	"strings"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// TestAuthFileReloadErrorsAndModeWarning: a line with its fields swapped
// (the password first) fails the reload without the password in the
// error or the log; a good file that group may read is loaded, with a
// warning.
func TestAuthFileReloadErrorsAndModeWarning(t *testing.T) {
	oneIO(t) // the reload is the same in every I/O model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	var logs logbuf.Buffer
	a, _, users := authSetup(t, up.URI(), &logs)
	if strings.Contains(logs.String(), "chmod 600") {
		t.Fatalf("a 0600 auth_file was warned about: %s", logs.String())
	}
	const pw = "Xk7-distinctive-secret"
	for _, line := range []string{`"` + pw + `" "app@admin"`, `"` + pw + `@x" "SCRAM-SHA-256$1"`} {
		if err := os.WriteFile(users, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := a.Reload()
		if err == nil || !strings.Contains(err.Error(), "users.txt:1:") {
			t.Fatalf("reload of a swapped line: %v", err)
		}
		if strings.Contains(err.Error(), "distinctive") || strings.Contains(logs.String(), "distinctive") {
			t.Fatalf("the secret is in the reload error or the log: %v\n%s", err, logs.String())
		}
	}
	if err := os.WriteFile(users, []byte(`"app@admin" "pw"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(users, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "chmod 600") || !strings.Contains(logs.String(), "0644") {
		t.Fatalf("no warning about a world-readable auth_file: %s", logs.String())
	}
}
