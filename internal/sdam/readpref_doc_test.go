package sdam

import (
	"reflect"
	"testing"
	"time"
)

// Document and ParseReadPref are inverses.
func TestReadPrefDocumentRoundTrip(t *testing.T) {
	for _, rp := range []ReadPref{
		{Mode: Primary},
		{Mode: Secondary},
		{Mode: SecondaryPreferred, TagSets: []TagSet{{"dc": "east", "rack": "1"}, {}}},
		{Mode: Nearest, MaxStaleness: 120 * time.Second},
	} {
		doc, err := rp.Document()
		if err != nil {
			t.Fatalf("%v: %v", rp, err)
		}
		got, err := ParseReadPref(doc)
		if err != nil {
			t.Fatalf("%v: parse %v: %v", rp, doc, err)
		}
		if !reflect.DeepEqual(got, rp) {
			t.Errorf("round trip of %v gave %v (%v)", rp, got, doc)
		}
	}
}
