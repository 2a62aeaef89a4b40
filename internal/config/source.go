package config

import (
	"slices"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// position is where a key starts in the document (1-based).
type position struct{ line, column int }

// entry is what the document says about one key path.
type entry struct {
	path []string
	pos  position
	// raw is the value as written, for scalars; "" for tables.
	raw string
}

// source remembers where each key of a parsed document is, so that problems
// found after decoding, by checks that only see typed values, can still name
// file:line.
type source struct {
	file    string
	entries map[string]entry
	// byPos maps the position of a key part to the path it completes.
	byPos map[position]string
	// lineStarts holds the offset of each line's first byte, so that
	// positions cost a binary search rather than a scan from the start
	// (go-toml's Parser.Shape scans, which is quadratic over a document).
	lineStarts []int
}

// positionOf converts a byte offset into a 1-based line and column (in
// bytes, as go-toml counts them).
func (s *source) positionOf(offset int) position {
	line := sort.Search(len(s.lineStarts), func(i int) bool { return s.lineStarts[i] > offset })
	return position{line: line, column: offset - s.lineStarts[line-1] + 1}
}

// pathKey turns a key path into a map key. NUL cannot appear in a TOML key
// without an escape, and is unlikely with one, so it separates parts
// unambiguously enough for locating messages.
func pathKey(parts []string) string { return strings.Join(parts, "\x00") }

// lookup returns the position of the longest recorded prefix of parts, so a
// problem with a key that is absent (a missing connection_string, say) points
// at its table.
func (s *source) lookup(parts []string) (entry, bool) {
	if s == nil {
		return entry{}, false
	}
	for n := len(parts); n > 0; n-- {
		if e, ok := s.entries[pathKey(parts[:n])]; ok {
			return e, true
		}
	}
	return entry{}, false
}

// has reports whether the document sets exactly this key path.
func (s *source) has(parts []string) bool {
	if s == nil {
		return false
	}
	_, ok := s.entries[pathKey(parts)]
	return ok
}

// fullPath finds the whole path of a key reported at line:column with a
// partial path: go-toml's strict mode gives keys inside an inline table
// relative to that table.
func (s *source) fullPath(line, column int, partial []string) []string {
	if s == nil || len(partial) == 0 {
		return partial
	}
	e, ok := s.entries[s.byPos[position{line, column}]]
	if ok && len(e.path) >= len(partial) && e.path[len(e.path)-1] == partial[len(partial)-1] {
		return e.path
	}
	return partial
}

// indexDocument records the position of every key and table in data. The
// document must already have decoded without a syntax error; if the parser
// stops early anyway, what was indexed so far is kept.
func indexDocument(file string, data []byte) *source {
	s := &source{file: file, entries: make(map[string]entry), byPos: make(map[position]string), lineStarts: []int{0}}
	for i, b := range data {
		if b == '\n' {
			s.lineStarts = append(s.lineStarts, i+1)
		}
	}
	var p unstable.Parser
	p.Reset(data)
	var table []string
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = s.recordKey(&p, nil, e.Key())
		case unstable.KeyValue:
			s.recordKeyValue(&p, table, e)
		}
	}
	return s
}

// recordKey records each part of a (possibly dotted) key under prefix, the
// first occurrence winning, and returns the full path.
func (s *source) recordKey(p *unstable.Parser, prefix []string, it unstable.Iterator) []string {
	path := append([]string(nil), prefix...)
	for it.Next() {
		n := it.Node()
		path = append(path, string(n.Data))
		k := pathKey(path)
		if _, seen := s.entries[k]; !seen {
			pos := s.positionOf(int(n.Raw.Offset))
			s.entries[k] = entry{path: slices.Clone(path), pos: pos}
			s.byPos[pos] = k
		}
	}
	return path
}

// recordKeyValue records a key = value expression, descending into inline
// tables.
func (s *source) recordKeyValue(p *unstable.Parser, table []string, kv *unstable.Node) {
	path := s.recordKey(p, table, kv.Key())
	v := kv.Value()
	k := pathKey(path)
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if it.Node().Kind == unstable.KeyValue {
				s.recordKeyValue(p, path, it.Node())
			}
		}
	case unstable.Array:
		e := s.entries[k]
		e.raw = "[...]"
		s.entries[k] = e
	default:
		// A connection string holds a password, and a Config (which
		// points here) may be printed: keep its text out.
		if path[len(path)-1] == "connection_string" {
			return
		}
		e := s.entries[k]
		e.raw = string(p.Raw(v.Raw))
		s.entries[k] = e
	}
}
