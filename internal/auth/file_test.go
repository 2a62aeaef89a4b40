package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdg-go/scram"
)

func TestParseFileForms(t *testing.T) {
	l256, _ := HashPassword("u", "db", "pw")
	fields := strings.SplitN(l256, `" "`, 2)
	forms := strings.Fields(strings.TrimSuffix(fields[1], `"`))
	if len(forms) != 2 || !strings.HasPrefix(forms[0], "SCRAM-SHA-256$15000:") || !strings.HasPrefix(forms[1], "SCRAM-SHA-1$10000:") {
		t.Fatalf("hash-password line %q", l256)
	}
	file := strings.Join([]string{
		"# comment",
		"; another",
		"",
		`"both@db" "` + forms[0] + ` ` + forms[1] + `"  # trailing comment`,
		`"split@db" "` + forms[0] + `"`,
		`"split@db" "` + forms[1] + `"`,
		`"only256@db" "` + forms[0] + `"`,
		`"me@example.com@admin" "a ""quoted"" pass word"`,
	}, "\r\n")
	u, err := ParseFile([]byte(file), "users.txt")
	if err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]int{"both": 2, "split": 2, "only256": 1} {
		c, ok := u.Lookup(user, "db")
		if !ok || len(c.Mechanisms()) != want {
			t.Fatalf("%s: %v %v", user, ok, c)
		}
		if _, has := c.Password(); has {
			t.Fatalf("%s: stored forms give no password", user)
		}
	}
	c, ok := u.Lookup("me@example.com", "admin")
	if p, _ := c.Password(); !ok || p != `a "quoted" pass word` || len(c.Mechanisms()) != 2 {
		t.Fatalf("plain password entry: %v %q", ok, p)
	}
	if u.Len() != 4 || strings.Contains(u.String()+c.String(), "pass") {
		t.Fatalf("%d users, %s %s", u.Len(), u, c)
	}
}

func TestParseFileErrorsNameTheLine(t *testing.T) {
	line, _ := HashPassword("u", "db", "pw")
	cases := []struct{ file, want string }{
		{"\n\nuser@db secret", "users.txt:3: the user: must be in double quotes"},
		{`"u@db"`, "users.txt:1: no secret"},
		{`"u@db" "x`, "users.txt:1: the secret: the closing double quote is missing"},
		{`"udb" "x"`, `users.txt:1: the first field must be "user@db"`},
		{`"u@" "x"`, `must be "user@db"`},
		{`"u@db" "x" extra`, "unexpected text after the secret"},
		{`"u@db" ""`, "empty secret"},
		{`"u@db" "SCRAM-SHA-256$12:zz$aa:bb"`, "users.txt:1: the secret: SCRAM-SHA-256 secret: the salt is not base64"},
		{`"u@db" "SCRAM-SHA-1$100:YWJj$YWJj:YWJj"`, "keys must be 20 bytes"},
		{`"u@db" "SCRAM-SHA-512$1:a$b:c"`, "users.txt:1: the secret: a stored secret starts with"},
		{"\"u@db\" \"pw\"\n" + line, "users.txt:2: this user has SCRAM-SHA-1 already (line 1)"},
		{"\"u@db\" \"\u00ad\u0627x1\"", "SASLprep"},
		{strings.Repeat("x", MaxLineLen+1), "users.txt:1: line longer than"},
	}
	for _, c := range cases {
		_, err := ParseFile([]byte(c.file), "users.txt")
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrAuthFile) {
			t.Errorf("%q: got %v, want %q", c.file, err, c.want)
		}
		if err != nil && strings.Contains(c.file, "SCRAM") && strings.Contains(err.Error(), "YWJj") {
			t.Errorf("error quotes the secret: %v", err)
		}
	}
}

func TestCacheOneLookupInFlightAndTTLs(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		calls.Add(1)
		<-release
		if user == "ghost" {
			return Creds{}, ErrNotFound
		}
		return Creds{password: "x"}, nil
	}), CacheOptions{PositiveTTL: time.Hour, NegativeTTL: time.Hour, Timeout: 5 * time.Second})
	now := time.Now()
	c.now = func() time.Time { return now }
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if cr, err := c.Get(ctx, "u", "db"); err != nil || cr.password != "x" {
				t.Error(cr, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d lookups for one user, want 1", n)
	}
	if _, err := c.Get(context.Background(), "ghost", "db"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), "ghost", "db"); !errors.Is(err, ErrNotFound) || calls.Load() != 2 {
		t.Fatalf("negative answer not cached: %v, %d calls", err, calls.Load())
	}
	now = now.Add(2 * time.Hour)
	_, _ = c.Get(context.Background(), "u", "db")
	if calls.Load() != 3 {
		t.Fatalf("expired entry not refreshed: %d calls", calls.Load())
	}
}

func TestCacheTimeoutAndWaiterCancel(t *testing.T) {
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		<-ctx.Done()
		return Creds{}, ctx.Err()
	}), CacheOptions{Timeout: 50 * time.Millisecond})
	start := time.Now()
	if _, err := c.Get(context.Background(), "u", "db"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("lookup timeout not applied")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx, "v", "db"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the lookup end before goleak looks
}

// No way of printing users, credentials or an identity shows a secret.
func TestPrintingShowsNoSecret(t *testing.T) {
	u, err := ParseFile([]byte(`"u@db" "hunter2-password"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := u.Lookup("u", "db")
	sc, _ := c.For(SCRAMSHA256)
	id := Identity{User: "u", DB: "db", Mechanism: SCRAMSHA256, ClientKey: []byte("client-key-bytes"),
		stored: sc, password: "hunter2-password"}
	pt, _ := id.PassThrough()
	var out strings.Builder
	for _, v := range []any{u, *u, c, &c, id, &id, pt, &pt} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			fmt.Fprintf(&out, verb+"\n", v)
		}
	}
	for _, secret := range []string{"hunter2", "client-key-bytes", fmt.Sprintf("%v", sc.StoredKey[:4]), string(sc.StoredKey[:6])} {
		if strings.Contains(out.String(), secret) {
			t.Fatalf("%q shown in:\n%s", secret, out.String())
		}
	}
}

func TestCacheForgetAsksAgain(t *testing.T) {
	var calls atomic.Int32
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		calls.Add(1)
		return Creds{password: "x"}, nil
	}), CacheOptions{PositiveTTL: time.Hour})
	a := New(&Users{}, nil, c)
	ctx := context.Background()
	for range 3 {
		if _, err := c.Get(ctx, "u", "db"); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("%d lookups, want 1 (cached)", calls.Load())
	}
	a.Refresh("other", "db") // another user's refresh leaves u cached
	_, _ = c.Get(ctx, "u", "db")
	if calls.Load() != 1 {
		t.Fatalf("%d lookups after another user's refresh", calls.Load())
	}
	a.Refresh("u", "db")
	_, _ = c.Get(ctx, "u", "db")
	if calls.Load() != 2 {
		t.Fatalf("%d lookups after Refresh, want 2", calls.Load())
	}
}

// At most MaxLookups lookups run at once, whatever the users: one past
// them waits for a slot, up to the lookup timeout, then fails with
// ErrLookupsBusy (not cached), and its login fails as an unknown user's;
// a slot that frees during the wait is taken.
func TestCacheBoundsLookupsAtOnce(t *testing.T) {
	sc, _ := Derive(SCRAMSHA256, "late", "pw", []byte("0123456789abcdef"), 4096)
	lateCreds, err := NewCreds(map[Mechanism]scram.StoredCredentials{SCRAMSHA256: sc})
	if err != nil {
		t.Fatal(err)
	}
	var running, peak, calls atomic.Int32
	release := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		calls.Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if user != "late" {
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		return lateCreds, nil
	}), CacheOptions{MaxLookups: 2, Timeout: 300 * time.Millisecond}) // the blocked lookups ignore it
	var wg sync.WaitGroup
	for _, u := range []string{"a", "b"} {
		wg.Go(func() { _, _ = c.Get(context.Background(), u, "db") })
	}
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Both slots taken: a third user's lookup waits, then fails.
	start := time.Now()
	if _, err := c.Get(context.Background(), "late", "db"); !errors.Is(err, ErrLookupsBusy) {
		t.Fatalf("a lookup past MaxLookups: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("waited %v for a slot, want the lookup timeout (300ms)", d)
	}
	// Its login fails as an unknown user's would.
	a := New(&Users{}, nil, c)
	if _, err := login(t, a, SCRAMSHA256, "late", "db", "pw", true); !IsAuthFailed(err) {
		t.Fatalf("login while the lookups are busy: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d lookups ran, want 2 (MaxLookups)", calls.Load())
	}
	// A slot that frees during the wait is taken, and the busy answer was
	// not cached: the user logs in now.
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(release)
	}()
	if id, err := login(t, a, SCRAMSHA256, "late", "db", "pw", true); err != nil || id.User != "late" {
		t.Fatalf("login once a slot freed: %v %v", id, err)
	}
	wg.Wait()
	if peak.Load() != 2 {
		t.Fatalf("%d lookups ran at once, want 2", peak.Load())
	}
}

// TestParseFileErrorsNeverQuoteAField: a line with its fields swapped (or
// a password typed where the user goes) puts the password in the first
// field; no error may print it, whatever goes wrong with the line. The
// errors end up in the reload reply and the log.
func TestParseFileErrorsNeverQuoteAField(t *testing.T) {
	const pw = "Zq9-distinctive-pw"
	for _, file := range []string{
		`"` + pw + `" "alice@admin"`,                         // swapped, no @ in the password
		`"` + pw + `@x" "SCRAM-SHA-256$bad"`,                 // swapped, an @ in the password
		`"` + pw + `@x" ""`,                                  // a password and nothing else
		`"` + pw + `@x" "pw"` + "\n" + `"` + pw + `@x" "pw"`, // twice
		`"` + pw + `"`,                                       // no second field
		`"` + pw + `" "x" trailing`,                          // text after
	} {
		_, err := ParseFile([]byte(file), "users.txt")
		if err == nil {
			t.Fatalf("%q parsed", file)
		}
		if strings.Contains(err.Error(), "distinctive") {
			t.Errorf("the error quotes a field: %v", err)
		}
	}
}

// TestStoredIterationBound: a stored form may ask for MaxIterations
// (100000) at most; past it the line is refused, as a typo that would make
// every client's login cost seconds.
func TestStoredIterationBound(t *testing.T) {
	for _, c := range []struct {
		iters int
		ok    bool
	}{{MinIterations, true}, {DefaultMaxIterations, true}, {DefaultMaxIterations + 1, false}, {10_000_000, false}} {
		sc, err := Derive(SCRAMSHA256, "u", "pw", []byte("0123456789abcdef0123456789ab"), MinIterations)
		if err != nil {
			t.Fatal(err)
		}
		sc.Iters = c.iters // the keys do not matter to the parser
		_, err = ParseFile([]byte(`"u@admin" "`+FormatStored(SCRAMSHA256, sc)+`"`), "t")
		if (err == nil) != c.ok {
			t.Errorf("%d iterations: %v", c.iters, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "iteration count")) {
			t.Errorf("%d iterations: %v, want the iteration count named", c.iters, err)
		}
	}
}
