package sdam

// Encoding a read preference: the $readPreference document a route's
// default read preference adds to the commands that carry none.

import (
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Document encodes the read preference as the $readPreference document a
// command carries to a mongos or a replica-set member (server-selection
// spec, "Passing read preference to mongos"): mode, tags when set, and
// maxStalenessSeconds when set. Tag keys are written in sorted order, so the
// encoding of one read preference is always the same. ParseReadPref reads
// it back.
func (rp ReadPref) Document() (bsoncore.Document, error) {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "mode", rp.Mode.String())
	if len(rp.TagSets) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "tags")
		for i, ts := range rp.TagSets {
			keys := make([]string, 0, len(ts))
			for k := range ts {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			tidx, td := bsoncore.AppendDocumentElementStart(d, strconv.Itoa(i))
			for _, k := range keys {
				td = bsoncore.AppendStringElement(td, k, ts[k])
			}
			var err error
			if d, err = bsoncore.AppendDocumentEnd(td, tidx); err != nil {
				return nil, err
			}
		}
		var err error
		if doc, err = bsoncore.AppendArrayEnd(d, aidx); err != nil {
			return nil, err
		}
	}
	if rp.MaxStaleness > 0 {
		doc = bsoncore.AppendInt64Element(doc, "maxStalenessSeconds", int64(rp.MaxStaleness.Seconds()))
	}
	return bsoncore.AppendDocumentEnd(doc, idx)
}
