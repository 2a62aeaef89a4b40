package config

import (
	"errors"
	"sort"
	"strconv"
	"strings"
)

// Categories of configuration problems. Every *Error wraps one of these (or,
// for Load, the error that made the file unreadable), so callers can branch
// with errors.Is without parsing messages.
var (
	// ErrSyntax marks a document that is not well-formed TOML, or that
	// defines a key twice.
	ErrSyntax = errors.New("config: TOML syntax error")
	// ErrUnknownKey marks a key or table that mongobouncer does not know,
	// usually a typo.
	ErrUnknownKey = errors.New("config: unknown key")
	// ErrInvalidValue marks a value of the wrong type, out of range, or in
	// conflict with another value, and a required value that is missing.
	ErrInvalidValue = errors.New("config: invalid value")
	// ErrConnString marks a connection string that does not parse.
	ErrConnString = errors.New("config: invalid connection string")
	// ErrConnStringWarning marks what Config.Warnings reports: a
	// connection-string problem the spec says to warn about and ignore.
	ErrConnStringWarning = errors.New("config: connection string warning")
	// ErrTLSWarning marks what Config.Warnings reports about the client
	// TLS keys: a valid combination that does less than it may seem to.
	ErrTLSWarning = errors.New("config: client TLS warning")
)

// Error is one configuration problem. Parse, Load and Validate report every
// problem they find at once, joined with errors.Join; errors.As finds the
// first one and Problems lists them all.
type Error struct {
	// File names the file the problem was found in; "" for a Config built
	// in code.
	File string
	// Line and Column locate the offending key (1-based); 0 when unknown,
	// for instance for a Config built in code. The message prints the line
	// only, in the file:line form editors and humans expect; the column is
	// here for tools.
	Line, Column int
	// Key is the dotted path of the offending key, such as
	// databases.orders.max_pool_size, or "" when the problem is not about
	// one key.
	Key string
	// Msg says what is wrong and how to fix it.
	Msg string
	// Err is the category (ErrSyntax, ErrUnknownKey, ...) or the underlying
	// cause; it is what errors.Is and errors.As see through Unwrap.
	Err error
}

// Error formats the problem as "file:line: message".
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File)
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	case e.File != "":
		b.WriteString(e.File)
		b.WriteString(": ")
	case e.Line > 0:
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the category or cause of the problem.
func (e *Error) Unwrap() error { return e.Err }

// Problems lists the individual problems inside an error returned by Parse,
// Load, Validate or Routes, in the order they are reported (by position for
// a file). It returns nil for a nil error and for errors of other kinds.
func Problems(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Error:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	return out
}

// joinProblems orders problems by position, keeping the order they were
// found in among equals (problems without a position keep their place at
// the end), and joins them into one error.
func joinProblems(problems []*Error) error {
	if len(problems) == 0 {
		return nil
	}
	sort.SliceStable(problems, func(i, j int) bool {
		a, b := problems[i], problems[j]
		if (a.Line == 0) != (b.Line == 0) {
			return a.Line != 0
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// suggest returns the candidate the user most likely meant by got, or "".
// It catches case and separator slips (maxPoolSize, max-pool-size), small
// typos (edit distance up to 2, or a third of the word) and truncations
// (max_pool for max_pool_size).
func suggest(got string, candidates []string) string {
	norm := func(s string) string {
		s = strings.ToLower(s)
		s = strings.ReplaceAll(s, "_", "")
		return strings.ReplaceAll(s, "-", "")
	}
	g := norm(got)
	if g == "" {
		return ""
	}
	best, bestDist := "", -1
	for _, c := range candidates {
		n := norm(c)
		if n == g {
			return c
		}
		d := editDistance(g, n)
		ok := d <= 2 || d <= len(g)/3
		if !ok && len(g) >= 4 && (strings.HasPrefix(n, g) || strings.HasPrefix(g, n)) {
			ok = true
		}
		if ok && (bestDist < 0 || d < bestDist) {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes. Keys
// are short, and inputs are bounded by the caller (suggest only runs on keys
// the document contains, which the config file size limit bounds), so the
// quadratic cost does not matter; it is capped anyway to keep fuzzing fast.
func editDistance(a, b string) int {
	const maxLen = 256
	if len(a) > maxLen || len(b) > maxLen {
		return maxLen
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
