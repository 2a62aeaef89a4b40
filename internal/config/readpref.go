// This file holds the read-preference settings a route carries to server
// selection: the mode, the tag sets and max staleness. Their rules (the
// server-selection and max-staleness specs') are sdam's, which owns them;
// this file applies them to the configuration's keys.

package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
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

// readPreferenceModes lists the modes as the spec spells them, from sdam
// (which owns them), for messages and the connection-string option.
var readPreferenceModes = func() []string {
	var out []string
	for m := sdam.Primary; m <= sdam.Nearest; m++ {
		out = append(out, m.String())
	}
	return out
}()

// Valid reports whether m is one of the defined modes, spelt as the spec
// does (sdam.ParseMode decides).
func (m ReadPreferenceMode) Valid() bool {
	_, err := sdam.ParseMode(string(m))
	return err == nil
}

// DefaultLocalThreshold is the server selection spec's default
// localThresholdMS: servers within this round-trip time of the fastest
// are all eligible.
const DefaultLocalThreshold = 15 * time.Millisecond

// readPrefIssues checks the read preference settings of p, alone and
// together, as pool issues (see poolIssues). Which settings are wrong is
// decided by sdam, the one owner of the read preference rules (the
// server-selection and max-staleness specs); this says which keys to
// change, in the configuration's words, and keeps sdam's error as the
// issue's cause for errors.Is.
func readPrefIssues(p Pool) []poolIssue {
	var out []poolIssue
	one := func(key, problem string, cause error) {
		out = append(out, poolIssue{keys: []string{key}, cause: cause, msg: func(show func(string) string) string {
			return show(key) + ": " + problem
		}})
	}
	mode, modeErr := sdam.ParseMode(string(p.ReadPreference))
	if modeErr != nil {
		problem := "must be one of " + strings.Join(readPreferenceModes, ", ")
		if s := suggest(string(p.ReadPreference), readPreferenceModes); s != "" {
			problem += fmt.Sprintf(" (did you mean %q?)", s)
		}
		one("read_preference", problem, modeErr)
	}
	if p.LocalThreshold < 0 {
		one("local_threshold", `must not be negative ("0s" picks only the fastest server)`, nil)
	}
	rp := sdam.ReadPref{Mode: mode, MaxStaleness: p.MaxStaleness}
	for _, ts := range p.ReadPreferenceTags {
		rp.TagSets = append(rp.TagSets, sdam.TagSet(ts))
	}
	if modeErr != nil {
		// The mode is reported above; the rules that need it are not
		// judged against a guess of it.
		rp.Mode, rp.TagSets = sdam.Nearest, nil
	}
	for _, e := range rp.Problems(p.HeartbeatInterval) {
		switch {
		case e.Field == "tags":
			out = append(out, poolIssue{keys: []string{"read_preference_tags", "read_preference"}, cause: e, msg: func(show func(string) string) string {
				return show("read_preference_tags") + " with " + show("read_preference") +
					": tags select secondaries, so they need another mode (primaryPreferred, secondary, secondaryPreferred, nearest)"
			}})
		case errors.Is(e, sdam.ErrPrimaryWithOptions):
			out = append(out, poolIssue{keys: []string{"max_staleness", "read_preference"}, cause: e, msg: func(show func(string) string) string {
				return show("max_staleness") + " with " + show("read_preference") +
					": max staleness applies to secondaries, so it needs another mode"
			}})
		case errors.Is(e, sdam.ErrMaxStalenessBelowHeartbeat):
			out = append(out, poolIssue{keys: []string{"max_staleness", "heartbeat_interval"}, cause: e, msg: func(show func(string) string) string {
				return show("max_staleness") + " is less than " + show("heartbeat_interval") +
					" plus the 10s idle write period: staleness cannot be measured that finely; raise max_staleness"
			}})
		case errors.Is(e, sdam.ErrMaxStalenessTooSmall):
			one("max_staleness", "must be at least 90s (the max staleness spec's smallest), or 0s for no maximum", e)
		case e.Field == "maxStalenessSeconds" && p.MaxStaleness < 0:
			one("max_staleness", `must not be negative ("0s" means no maximum)`, e)
		default:
			one("read_preference", e.Reason, e)
		}
	}
	return out
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
