package auth

import (
	"strings"
	"testing"
)

// FuzzParseFile feeds arbitrary auth_files to the parser: it must never
// panic, and what it accepts must give usable credentials.
func FuzzParseFile(f *testing.F) {
	line, _ := HashPassword("u", "db", "pw")
	for _, s := range []string{
		"", "# c\n", `"u@db" "pw"`, line, `"a""b@db" "x"` + "\r\n", `"u@db" "SCRAM-SHA-1$4096:YWJj$` + strings.Repeat("A", 27) + "=:x\"",
		`"u@db"`, `"u@db" "x" # y`, "\"u@db\" \"SCRAM-SHA-256$ SCRAM-SHA-1$\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return // plain passwords cost a key derivation per line
		}
		u, err := ParseFile(data, "fuzz")
		if err != nil {
			return
		}
		for _, c := range u.m {
			if len(c.Mechanisms()) == 0 {
				t.Fatal("a user without credentials")
			}
		}
	})
}
