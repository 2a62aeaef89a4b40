// This file holds the read-preference settings a route carries to server
// selection: the mode, the tag sets and max staleness, with the checks the
// server-selection and max-staleness specs define.

package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ReadPreferenceMode is a read preference mode of the server selection
// spec. It chooses which members of a replica set mongobouncer's own reads
// may go to.
type ReadPreferenceMode string

// Read preference modes.
const (
	ReadPrimary            ReadPreferenceMode = "primary"
	ReadPrimaryPreferred   ReadPreferenceMode = "primaryPreferred"
	ReadSecondary          ReadPreferenceMode = "secondary"
	ReadSecondaryPreferred ReadPreferenceMode = "secondaryPreferred"
	ReadNearest            ReadPreferenceMode = "nearest"
)

// readPreferenceModes lists the modes as the spec spells them.
var readPreferenceModes = []string{
	string(ReadPrimary), string(ReadPrimaryPreferred), string(ReadSecondary),
	string(ReadSecondaryPreferred), string(ReadNearest),
}

// Valid reports whether m is one of the defined modes, spelt as the spec
// does.
func (m ReadPreferenceMode) Valid() bool { return slices.Contains(readPreferenceModes, string(m)) }

// SmallestMaxStaleness is the max-staleness spec's smallestMaxStalenessSeconds:
// no max staleness below it is accepted, since staleness is only known to
// within a heartbeat plus the primary's idle write period.
const SmallestMaxStaleness = 90 * time.Second

// IdleWritePeriod is the max-staleness spec's idleWritePeriodMS: how often
// an idle primary writes a no-op, which bounds how precisely a secondary's
// staleness can be estimated.
const IdleWritePeriod = 10 * time.Second

// DefaultLocalThreshold is the server selection spec's default
// localThresholdMS: servers within this round-trip time of the fastest
// are all eligible.
const DefaultLocalThreshold = 15 * time.Millisecond

// readPrefIssues checks the read preference settings of p, alone and
// together, as pool issues (see poolIssues).
func readPrefIssues(p Pool) []poolIssue {
	var out []poolIssue
	one := func(key, problem string) {
		out = append(out, poolIssue{keys: []string{key}, msg: func(show func(string) string) string {
			return show(key) + ": " + problem
		}})
	}
	if !p.ReadPreference.Valid() {
		problem := "must be one of " + strings.Join(readPreferenceModes, ", ")
		if s := suggest(string(p.ReadPreference), readPreferenceModes); s != "" {
			problem += fmt.Sprintf(" (did you mean %q?)", s)
		}
		one("read_preference", problem)
	}
	if p.LocalThreshold < 0 {
		one("local_threshold", `must not be negative ("0s" picks only the fastest server)`)
	}
	if p.MaxStaleness < 0 {
		one("max_staleness", `must not be negative ("0s" means no maximum)`)
	} else if p.MaxStaleness > 0 && p.MaxStaleness < SmallestMaxStaleness {
		one("max_staleness", "must be at least 90s (the max staleness spec's smallest), or 0s for no maximum")
	} else if p.MaxStaleness > 0 && p.MaxStaleness < p.HeartbeatInterval+IdleWritePeriod {
		out = append(out, poolIssue{keys: []string{"max_staleness", "heartbeat_interval"}, msg: func(show func(string) string) string {
			return show("max_staleness") + " is less than " + show("heartbeat_interval") +
				" plus the 10s idle write period: staleness cannot be measured that finely; raise max_staleness"
		}})
	}
	if p.ReadPreference == ReadPrimary {
		if hasTags(p.ReadPreferenceTags) {
			out = append(out, poolIssue{keys: []string{"read_preference_tags", "read_preference"}, msg: func(show func(string) string) string {
				return show("read_preference_tags") + " with " + show("read_preference") +
					": tags select secondaries, so they need another mode (primaryPreferred, secondary, secondaryPreferred, nearest)"
			}})
		}
		if p.MaxStaleness > 0 {
			out = append(out, poolIssue{keys: []string{"max_staleness", "read_preference"}, msg: func(show func(string) string) string {
				return show("max_staleness") + " with " + show("read_preference") +
					": max staleness applies to secondaries, so it needs another mode"
			}})
		}
	}
	return out
}

// hasTags reports whether tag sets restrict anything: an empty list, or
// only empty sets (which match every server), do not.
func hasTags(sets []map[string]string) bool {
	for _, s := range sets {
		if len(s) > 0 {
			return true
		}
	}
	return false
}

// tagsTOML writes tag sets as TOML would, keys sorted.
func tagsTOML(sets []map[string]string) string {
	parts := make([]string, len(sets))
	for i, s := range sets {
		keys := sortedKeys(s)
		kv := make([]string, len(keys))
		for j, k := range keys {
			kv[j] = fmt.Sprintf("%s = %s", dotted([]string{k}), quote(s[k]))
		}
		parts[i] = "{" + strings.Join(kv, ", ") + "}"
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// tagsOption writes tag sets as readPreferenceTags options would.
func tagsOption(sets []map[string]string) string {
	parts := make([]string, len(sets))
	for i, s := range sets {
		keys := sortedKeys(s)
		kv := make([]string, len(keys))
		for j, k := range keys {
			kv[j] = k + ":" + s[k]
		}
		parts[i] = "readPreferenceTags=" + strings.Join(kv, ",")
	}
	return strings.Join(parts, "&")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
