package auth

// Secrets: the stored SCRAM form of the auth_file
// ("SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>", base64
// fields, as PostgreSQL and PgBouncer write them), credentials derived from
// a plain password, and the fake credentials of unknown users.

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/xdg-go/scram"
)

// parseStored reads one stored form. The error never quotes the secret.
func parseStored(s string) (Mechanism, scram.StoredCredentials, error) {
	var sc scram.StoredCredentials
	mech, rest, ok := strings.Cut(s, "$")
	m := Mechanism(mech)
	if !ok || hashOf(m) == nil {
		return "", sc, fmt.Errorf("a stored secret starts with SCRAM-SHA-256$ or SCRAM-SHA-1$")
	}
	factors, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return "", sc, fmt.Errorf("%s secret: want %s$<iterations>:<salt>$<StoredKey>:<ServerKey>", m, m)
	}
	iters, salt, ok1 := strings.Cut(factors, ":")
	stored, server, ok2 := strings.Cut(keys, ":")
	if !ok1 || !ok2 {
		return "", sc, fmt.Errorf("%s secret: want %s$<iterations>:<salt>$<StoredKey>:<ServerKey>", m, m)
	}
	n, err := strconv.Atoi(iters)
	if err != nil {
		return "", sc, fmt.Errorf("%s secret: the iteration count is not a number", m)
	}
	sc.Iters = n
	var b []byte
	if b, err = base64.StdEncoding.DecodeString(salt); err != nil {
		return "", sc, fmt.Errorf("%s secret: the salt is not base64", m)
	}
	sc.Salt = string(b)
	if sc.StoredKey, err = base64.StdEncoding.DecodeString(stored); err != nil {
		return "", sc, fmt.Errorf("%s secret: StoredKey is not base64", m)
	}
	if sc.ServerKey, err = base64.StdEncoding.DecodeString(server); err != nil {
		return "", sc, fmt.Errorf("%s secret: ServerKey is not base64", m)
	}
	if err := checkStored(m, sc); err != nil {
		return "", sc, fmt.Errorf("%s secret: %v", m, err)
	}
	return m, sc, nil
}

// FormatStored writes stored credentials in the auth_file's stored form.
func FormatStored(m Mechanism, sc scram.StoredCredentials) string {
	enc := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("%s$%d:%s$%s:%s", m, sc.Iters, enc([]byte(sc.Salt)), enc(sc.StoredKey), enc(sc.ServerKey))
}

// mongoPasswordDigest is the password SCRAM-SHA-1 uses in MongoDB:
// hex(MD5(user + ":mongo:" + password)), neither part SASLprepped.
func mongoPasswordDigest(user, password string) string {
	sum := md5.Sum([]byte(user + ":mongo:" + password))
	return hex.EncodeToString(sum[:])
}

// Derive computes the stored credentials of mechanism m for user's plain
// password with salt and iters: SCRAM-SHA-256 SASLpreps the password,
// SCRAM-SHA-1 uses MongoDB's MD5 digest of user and password. user is the
// bare user name (without @db).
func Derive(m Mechanism, user, password string, salt []byte, iters int) (scram.StoredCredentials, error) {
	var (
		cl  *scram.Client
		err error
	)
	switch m {
	case SCRAMSHA256:
		cl, err = scram.SHA256.NewClient(user, password, "")
		if err != nil {
			return scram.StoredCredentials{}, fmt.Errorf("the password cannot be prepared with SASLprep (RFC 4013): %w", ErrAuthFile)
		}
	case SCRAMSHA1:
		cl, err = scram.SHA1.NewClientUnprepped(user, mongoPasswordDigest(user, password), "")
		if err != nil {
			return scram.StoredCredentials{}, err
		}
	default:
		return scram.StoredCredentials{}, fmt.Errorf("%w: %q", ErrMechanism, m)
	}
	return cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iters})
}

// iterationsOf is MongoDB's default iteration count for m.
func iterationsOf(m Mechanism) int {
	if m == SCRAMSHA1 {
		return DefaultIterationsSHA1
	}
	return DefaultIterationsSHA256
}

// saltLen is the salt length MongoDB uses: 16 bytes for SHA-1, 28 for
// SHA-256 (the hash size less 4).
func saltLen(m Mechanism) int {
	if m == SCRAMSHA1 {
		return 16
	}
	return 28
}

// HashPassword returns the auth_file line for user@db with both SCRAM
// forms, each with a fresh random salt and MongoDB's default iteration
// count: what `mongobouncer hash-password` prints.
func HashPassword(user, db, password string) (string, error) {
	forms := make([]string, 0, 2)
	for _, m := range []Mechanism{SCRAMSHA256, SCRAMSHA1} {
		salt := make([]byte, saltLen(m))
		_, _ = rand.Read(salt) // never fails (crypto/rand)
		sc, err := Derive(m, user, password, salt, iterationsOf(m))
		if err != nil {
			return "", err
		}
		forms = append(forms, FormatStored(m, sc))
	}
	return quoteField(UserID{User: user, DB: db}.String()) + " " + quoteField(strings.Join(forms, " ")), nil
}

// quoteField writes an auth_file field: in double quotes, a quote inside
// doubled.
func quoteField(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// keyring derives values from user names: the salt of a plain password
// (stable across reloads, so drivers' cached keys stay valid) and the fake
// credentials of unknown users. Its key is random until SeedKeys derives it
// from a seed, the auth_file's contents: then the salts and fakes are the
// same after a restart too, as a real user's stored salt is, so comparing
// them across a restart does not tell the fakes out.
type keyring struct{ key atomic.Pointer[[32]byte] }

func newKeyring() *keyring {
	k := &keyring{}
	var key [32]byte
	_, _ = rand.Read(key[:])
	k.key.Store(&key)
	return k
}

// SeedKeys derives the process's key for plain-password salts and fake
// credentials from seed, a secret that stays the same across restarts (the
// auth_file's contents: they hold every user's secret, so an outsider
// cannot compute it). Call it at start, before the auth_file is parsed,
// and not on reload: users parsed before keep the salts they had.
func SeedKeys(seed []byte) {
	h := hmac.New(sha256.New, []byte("mongobouncer keyring v1"))
	h.Write(seed)
	var key [32]byte
	copy(key[:], h.Sum(nil))
	processKeys.key.Store(&key)
}

// derive returns n bytes of HMAC-SHA-256(key, purpose | mechanism | name).
func (k *keyring) derive(purpose string, m Mechanism, name string, n int) []byte {
	key := k.key.Load()
	var out []byte
	for i := byte(0); len(out) < n; i++ {
		h := hmac.New(sha256.New, key[:])
		h.Write([]byte{i})
		h.Write([]byte(purpose + "\x00" + string(m) + "\x00" + name))
		out = h.Sum(out)
	}
	return out[:n]
}

// fake returns credentials for a user that does not exist: a salt and keys
// that look like any other, with the shape (iteration count, salt length)
// most real users of m have, the same for the same name within a process
// (and across restarts once seeded), so that neither the first server
// message nor the failure tells an unknown user from a wrong password.
func (k *keyring) fake(m Mechanism, key string, sh shape) scram.StoredCredentials {
	size := hashOf(m)().Size()
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(k.derive("salt", m, key, sh.saltLen)), Iters: sh.iters},
		StoredKey:  k.derive("stored", m, key, size),
		ServerKey:  k.derive("server", m, key, size),
	}
}
