package auth

// The auth_file: one user per line, PgBouncer style,
//
//	"user@db" "secret"
//
// Fields are in double quotes; a double quote inside a field is written
// twice (""). The user is split from its authentication database at the
// last @ (ParseUserID: user names may hold one, as e-mail addresses do, and
// a database named here cannot). The secret is
// either a plain password, or one or more stored forms separated by
// spaces:
//
//	SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
//	SCRAM-SHA-1$<iterations>:<salt>$<StoredKey>:<ServerKey>
//
// (base64 fields). A secret that starts with "SCRAM-" and holds a $ is
// read as stored forms (so that a mistyped one is an error, not a
// password), anything else as a plain password, from which both mechanisms' credentials are derived. The same
// user may also appear on several lines, each adding mechanisms; a
// mechanism given twice is an error. Blank lines and lines starting with #
// or ; are comments, as is anything after the fields that starts with #.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
)

// Bounds on an auth_file.
const (
	// MaxFileSize is the largest auth_file read.
	MaxFileSize = 16 << 20
	// MaxLineLen is the longest line accepted.
	MaxLineLen = 64 << 10
)

// FileError is one problem in an auth_file, with its line. It never
// quotes a field of the line: a line with its fields swapped, or a
// password typed where the user goes, would print the password in the
// reload error and the log. The line number says where to look.
type FileError struct {
	File string
	Line int // 0 when the problem is the whole file
	Msg  string
}

// Error returns "file:line: message".
func (e *FileError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// Unwrap makes errors.Is(err, ErrAuthFile) true.
func (e *FileError) Unwrap() error { return ErrAuthFile }

// Users are the users of one auth_file, by UserID. A Users is never
// changed once built, so it is shared freely.
type Users struct {
	m map[UserID]Creds
}

// Lookup returns the credentials of user on db.
func (u *Users) Lookup(user, db string) (Creds, bool) {
	if u == nil {
		return Creds{}, false
	}
	c, ok := u.m[UserID{User: user, DB: db}]
	return c, ok
}

// Len is the number of users.
func (u *Users) Len() int {
	if u == nil {
		return 0
	}
	return len(u.m)
}

// String counts the users, so that printing Users shows no secret.
func (u Users) String() string { return fmt.Sprintf("%d users", len(u.m)) }

// GoString is String, for %#v (which would otherwise print the stored
// keys).
func (u Users) GoString() string { return u.String() }

// LoadFile reads and parses the auth_file at path.
func LoadFile(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{File: path, Msg: "cannot read the auth_file: " + err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, &FileError{File: path, Msg: "cannot read the auth_file: " + err.Error()}
	}
	return ParseFile(data, path)
}

// ParseFile parses an auth_file; name labels its errors. It reports the
// first problem, with its line.
func ParseFile(data []byte, name string) (*Users, error) {
	if len(data) > MaxFileSize {
		return nil, &FileError{File: name, Msg: fmt.Sprintf("larger than %d bytes: is this the auth_file?", MaxFileSize)}
	}
	u := &Users{m: map[UserID]Creds{}}
	seen := map[UserID]map[Mechanism]int{} // user -> mechanism -> line
	for n := 1; len(data) > 0; n++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		fail := func(format string, args ...any) error {
			return &FileError{File: name, Line: n, Msg: fmt.Sprintf(format, args...)}
		}
		if len(line) > MaxLineLen {
			return nil, fail("line longer than %d bytes", MaxLineLen)
		}
		s := strings.TrimSpace(strings.TrimSuffix(string(line), "\r"))
		if s == "" || s[0] == '#' || s[0] == ';' {
			continue
		}
		field, rest, err := quoted(s)
		if err != nil {
			return nil, fail("the user: %v; write \"user@db\" \"secret\"", err)
		}
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return nil, fail("no secret after the user: write \"user@db\" \"secret\"")
		}
		secret, rest, err := quoted(rest)
		if err != nil {
			return nil, fail("the secret: %v; write \"user@db\" \"secret\"", err)
		}
		if rest = strings.TrimSpace(rest); rest != "" && rest[0] != '#' {
			return nil, fail("unexpected text after the secret: one user per line, a comment starts with #")
		}
		who, ok := ParseUserID(field)
		if !ok {
			// Not quoted: a line with its fields swapped has the password
			// here.
			return nil, fail("the first field must be \"user@db\" (db is the authentication database, admin by default); are the fields swapped?")
		}
		if secret == "" {
			return nil, fail("empty secret")
		}
		found, err := credsOf(who.User, secret)
		if err != nil {
			return nil, fail("the secret: %v", err)
		}
		c := u.m[who]
		if seen[who] == nil {
			seen[who] = map[Mechanism]int{}
		}
		for _, m := range found.Mechanisms() {
			if prev, dup := seen[who][m]; dup {
				return nil, fail("this user has %s already (line %d): give each mechanism once", m, prev)
			}
			seen[who][m] = n
			sc, _ := found.For(m)
			c.set(m, sc)
		}
		if found.password != "" {
			c.password = found.password
		}
		u.m[who] = c
	}
	return u, nil
}

// quoted reads a double-quoted field at the start of s and returns it and
// what follows.
func quoted(s string) (field, rest string, err error) {
	if s == "" || s[0] != '"' {
		return "", "", fmt.Errorf("must be in double quotes")
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", fmt.Errorf("the closing double quote is missing")
}

// credsOf reads a secret field: stored forms or a plain password.
func credsOf(user, secret string) (Creds, error) {
	var c Creds
	if !strings.HasPrefix(secret, "SCRAM-") || !strings.Contains(secret, "$") {
		for _, m := range Mechanisms {
			salt := processKeys.derive("password-salt", m, user, saltLen(m))
			sc, err := Derive(m, user, secret, salt, plainIterations(m))
			if err != nil {
				return Creds{}, err
			}
			c.set(m, sc)
		}
		c.password = secret
		return c, nil
	}
	for _, form := range strings.Fields(secret) {
		m, sc, err := parseStored(form)
		if err != nil {
			return Creds{}, err
		}
		if !c.set(m, sc) {
			return Creds{}, fmt.Errorf("%s is given twice in one secret", m)
		}
	}
	return c, nil
}

// plainIterations is the iteration count a plain password is derived
// with: MongoDB's default (iterationsOf). It is a variable for
// FuzzParseFile alone, which derives with one iteration: the count takes
// no parsing path, and at 25,000 PBKDF2 rounds a line the fuzzer spent
// its time hashing rather than parsing.
var plainIterations = iterationsOf

// processKeys salts plain passwords and fakes unknown users for this
// process.
var processKeys = newKeyring()
