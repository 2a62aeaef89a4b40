// The in-memory engine's update and delete: enough for tests that send
// writing traffic other than inserts through a failover (equality filters,
// replacement documents or top-level $set, multi, upsert). Anything beyond
// that is refused with BadValue rather than misinterpreted. Inside a
// transaction they are refused too: the engine stages only inserts.

package fakemongo

import (
	"bytes"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// retriedLocked returns the key of a retryable write (a txnNumber outside a
// transaction) and, if that write already ran, its reply. Called with mu
// held.
func (st *store) retriedLocked(ti txnInfo) (txnKey, bool, Reply, bool) {
	if ti.lsid == nil || !ti.hasNumber || ti.inTxn {
		return txnKey{}, false, Reply{}, false
	}
	key := txnKey{lsid: string(ti.lsid), n: ti.n}
	if done, ok := st.retried[key]; ok {
		return key, true, Reply{Docs: []bsoncore.Document{done}}, true
	}
	return key, true, Reply{}, false
}

// retryableWrite runs write, the update or delete cmd of req, on its
// namespace with mu held, after the checks both share; a retried write
// gets the reply of its first run, and write's reply is kept for retries
// when it succeeded (ok).
func (st *store) retryableWrite(req *Request, cmd string, write func(ns string) (r Reply, ok bool)) Reply {
	coll, ok := collName(req)
	if !ok {
		return Error(codeBadValue, "", cmd+": collection name must be a non-empty string")
	}
	ti := parseTxnInfo(req.Body)
	if ti.inTxn {
		return Error(codeBadValue, "", "fakemongo: "+cmd+" in a transaction is not supported")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	key, retryable, done, ran := st.retriedLocked(ti)
	if ran {
		return done
	}
	r, ok := write(req.DB + "." + coll)
	if ok && retryable {
		st.retried[key] = r.Docs[0]
	}
	return r
}

func (st *store) deleteDocs(req *Request) Reply {
	return st.retryableWrite(req, "delete", func(ns string) (Reply, bool) { return st.deleteLocked(req, ns) })
}

func (st *store) deleteLocked(req *Request, ns string) (Reply, bool) {
	n := 0
	for _, del := range req.Documents("deletes") {
		q, _ := del.Lookup("q").DocumentOK()
		limit, _ := del.Lookup("limit").AsInt64OK()
		docs, seqs := st.colls[ns], st.seqs[ns]
		keptDocs, keptSeqs := make([]bsoncore.Document, 0, len(docs)), make([]uint64, 0, len(seqs))
		deleted := 0
		for i, d := range docs {
			match, err := matches(d, q)
			if err != nil {
				return Error(codeBadValue, "", err.Error()), false
			}
			if match && (limit == 0 || deleted == 0) {
				deleted++
				continue
			}
			keptDocs, keptSeqs = append(keptDocs, d), append(keptSeqs, seqs[i])
		}
		st.colls[ns], st.seqs[ns] = keptDocs, keptSeqs
		n += deleted
	}
	return OK(bson.E{Key: "n", Value: int32(n)}), true
}

func (st *store) update(req *Request) Reply {
	return st.retryableWrite(req, "update", func(ns string) (Reply, bool) { return st.updateLocked(req, ns) })
}

func (st *store) updateLocked(req *Request, ns string) (Reply, bool) {
	var matched, modified int32
	var upserted bson.A
	for i, up := range req.Documents("updates") {
		q, _ := up.Lookup("q").DocumentOK()
		u, ok := up.Lookup("u").DocumentOK()
		if !ok {
			return Error(codeBadValue, "", "fakemongo: update needs a document u (pipelines are not supported)"), false
		}
		multi, _ := up.Lookup("multi").BooleanOK()
		upsert, _ := up.Lookup("upsert").BooleanOK()
		hit := false
		docs := st.colls[ns]
		for j, d := range docs {
			match, err := matches(d, q)
			if err != nil {
				return Error(codeBadValue, "", err.Error()), false
			}
			if !match {
				continue
			}
			nd, err := applyUpdate(d, u)
			if err != nil {
				return Error(codeBadValue, "", err.Error()), false
			}
			hit = true
			matched++
			if !bytes.Equal(nd, d) {
				modified++
				docs[j] = nd
			}
			if !multi {
				break
			}
		}
		if hit || !upsert {
			continue
		}
		nd, err := applyUpdate(upsertBase(q), u)
		if err != nil {
			return Error(codeBadValue, "", err.Error()), false
		}
		nd = withID(nd)
		st.appendLocked(ns, nd)
		matched++
		id := nd.Lookup("_id")
		upserted = append(upserted, bson.D{{Key: "index", Value: int32(i)}, {Key: "_id", Value: bson.RawValue{Type: bson.Type(id.Type), Value: id.Data}}})
	}
	fields := []bson.E{{Key: "n", Value: matched}, {Key: "nModified", Value: modified}}
	if len(upserted) > 0 {
		fields = append(fields, bson.E{Key: "upserted", Value: upserted})
	}
	return OK(fields...), true
}

// applyUpdate returns d changed by u: a replacement document (d's _id
// kept) or {$set: {top-level fields}}.
func applyUpdate(d, u bsoncore.Document) (bsoncore.Document, error) {
	elems, err := u.Elements()
	if err != nil {
		return nil, fmt.Errorf("update: %w", err)
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+len(u)))
	if len(elems) == 0 || !strings.HasPrefix(elems[0].Key(), "$") {
		if id, err := d.LookupErr("_id"); err == nil {
			out = bsoncore.AppendValueElement(out, "_id", id)
		}
		for _, e := range elems {
			if e.Key() != "_id" || d.Lookup("_id").Type == 0 {
				out = append(out, e...)
			}
		}
		return endDoc(out, idx), nil
	}
	if len(elems) != 1 || elems[0].Key() != "$set" {
		return nil, fmt.Errorf("fakemongo: only $set is supported, not %s", elems[0].Key())
	}
	set, ok := elems[0].Value().DocumentOK()
	if !ok {
		return nil, fmt.Errorf("fakemongo: $set needs a document")
	}
	sets, err := set.Elements()
	if err != nil {
		return nil, fmt.Errorf("$set: %w", err)
	}
	for _, e := range sets {
		if strings.ContainsAny(e.Key(), ".$") || e.Key() == "_id" {
			return nil, fmt.Errorf("fakemongo: $set of %q is not supported", e.Key())
		}
	}
	old, err := d.Elements()
	if err != nil {
		return nil, fmt.Errorf("document: %w", err)
	}
	done := make(map[string]bool, len(sets))
	for _, e := range old {
		replaced := false
		for _, s := range sets {
			if s.Key() == e.Key() {
				out, replaced = append(out, s...), true
				done[s.Key()] = true
				break
			}
		}
		if !replaced {
			out = append(out, e...)
		}
	}
	for _, s := range sets {
		if !done[s.Key()] {
			out = append(out, s...)
		}
	}
	return endDoc(out, idx), nil
}

// upsertBase returns the document an upsert starts from: the filter's
// plain equality fields.
func upsertBase(q bsoncore.Document) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := q.Elements()
	for _, e := range elems {
		if strings.ContainsAny(e.Key(), ".$") {
			continue
		}
		if d, ok := e.Value().DocumentOK(); ok {
			if first, err := d.IndexErr(0); err == nil && strings.HasPrefix(first.Key(), "$") {
				continue
			}
		}
		out = append(out, e...)
	}
	return endDoc(out, idx)
}
