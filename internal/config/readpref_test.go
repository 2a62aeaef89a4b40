package config

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

// The configuration refuses exactly the read preferences sdam refuses, by
// sdam's rules (errors.Is finds sdam's kind in the configuration's error):
// one owner of the rules, not two copies that can drift apart.
func TestReadPrefRulesAreSdams(t *testing.T) {
	modes := []sdam.Mode{sdam.Primary, sdam.PrimaryPreferred, sdam.Secondary, sdam.SecondaryPreferred, sdam.Nearest}
	tagSets := [][]map[string]string{nil, {{}}, {{"dc": "east"}}, {{}, {"dc": "east"}}}
	stalenesses := []time.Duration{-time.Second, 0, 30 * time.Second, 89 * time.Second, 90 * time.Second, 95 * time.Second, 100 * time.Second, 130 * time.Second, time.Hour}
	heartbeats := []time.Duration{500 * time.Millisecond, 10 * time.Second, 85 * time.Second, 120 * time.Second}
	checked := 0
	for _, mode := range modes {
		for _, tags := range tagSets {
			for _, st := range stalenesses {
				for _, hb := range heartbeats {
					rp := sdam.ReadPref{Mode: mode, MaxStaleness: st}
					for _, ts := range tags {
						rp.TagSets = append(rp.TagSets, sdam.TagSet(ts))
					}
					want := rp.Validate(hb)

					c := Default()
					c.Global.ReadPreference = ReadPreferenceMode(mode.String())
					c.Global.ReadPreferenceTags = tags
					c.Global.MaxStaleness = st
					c.Global.HeartbeatInterval = hb
					c.Databases = map[string]Route{"*": {ConnectionString: "mongodb://h/"}}
					got := c.Validate()
					name := fmt.Sprintf("%v tags=%v max_staleness=%v heartbeat=%v", mode, tags, st, hb)
					checked++
					switch {
					case want == nil && got != nil:
						t.Errorf("%s: sdam accepts it, the configuration refuses it: %v", name, got)
					case want != nil && got == nil:
						t.Errorf("%s: sdam refuses it (%v), the configuration accepts it", name, want)
					case want != nil:
						var rpErr *sdam.ReadPrefError
						if !errors.As(got, &rpErr) || !errors.Is(got, sdam.ErrInvalidReadPref) {
							t.Errorf("%s: the configuration's error %v does not carry sdam's %v", name, got, want)
							continue
						}
						var wantErr *sdam.ReadPrefError
						errors.As(want, &wantErr)
						if wantErr.Kind != nil && !errors.Is(got, wantErr.Kind) {
							t.Errorf("%s: the configuration's error %v is not sdam's kind %v", name, got, wantErr.Kind)
						}
						if !errors.Is(got, ErrInvalidValue) {
							t.Errorf("%s: %v is not ErrInvalidValue", name, got)
						}
					}
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d combinations checked", checked)
	}
}

// A connection string's maxStalenessSeconds and its primary mode are
// judged by sdam too.
func TestConnStringReadPrefBySdam(t *testing.T) {
	for _, tc := range []struct {
		uri string
		ok  bool
	}{
		{"mongodb://h/?readPreference=secondary&maxStalenessSeconds=90", true},
		{"mongodb://h/?readPreference=secondary&maxStalenessSeconds=89", false},
		{"mongodb://h/?readPreference=secondary&maxStalenessSeconds=0", false},
		{"mongodb://h/?readPreference=secondary&maxStalenessSeconds=-1", true},
		{"mongodb://h/?readPreference=primary&maxStalenessSeconds=120", false},
		{"mongodb://h/?readPreference=primary&readPreferenceTags=dc:east", false},
		{"mongodb://h/?readPreference=primary&readPreferenceTags=", true},
	} {
		_, err := ParseConnString(tc.uri)
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", tc.uri, err, tc.ok)
		}
	}
}

// The configuration's spellings of the modes are sdam's.
func TestReadPreferenceModesAreSdams(t *testing.T) {
	for mode, want := range map[ReadPreferenceMode]sdam.Mode{
		ReadPrimary: sdam.Primary, ReadPrimaryPreferred: sdam.PrimaryPreferred, ReadSecondary: sdam.Secondary,
		ReadSecondaryPreferred: sdam.SecondaryPreferred, ReadNearest: sdam.Nearest,
	} {
		if got, err := sdam.ParseMode(string(mode)); err != nil || got != want || !mode.Valid() {
			t.Errorf("%q: sdam reads %v, %v; want %v", mode, got, err, want)
		}
	}
	if len(readPreferenceModes) != 5 || ReadPreferenceMode("Primary").Valid() {
		t.Errorf("modes %v; Primary valid %v", readPreferenceModes, ReadPreferenceMode("Primary").Valid())
	}
}
