package fakemongo

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// helloOf asks member m for hello over a fresh raw connection.
func helloOf(t *testing.T, m *Member) bsoncore.Document {
	t.Helper()
	return dialRaw(t, m.Server()).roundTrip(d{{"hello", 1}, {"$db", "admin"}})
}

func stringsOf(t *testing.T, r bsoncore.Document, key string) []string {
	t.Helper()
	arr, ok := r.Lookup(key).ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = v.StringValue()
	}
	return out
}

func strOf(r bsoncore.Document, key ...string) string {
	s, _ := r.Lookup(key...).StringValueOK()
	return s
}

func labelsOf(t *testing.T, r bsoncore.Document) []string { return stringsOf(t, r, "errorLabels") }

// session is an lsid document for raw requests.
func session(id string) d {
	return d{{"id", bson.Binary{Subtype: bson.TypeBinaryUUID, Data: []byte(id)}}}
}

func TestReplicaSetHello(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{
		Members: 5, Arbiters: []int{3}, Hidden: []int{4},
		Tags: map[int]map[string]string{1: {"dc": "east", "rack": "r1"}},
	})
	m := rs.Members()
	wantHosts := []string{m[0].Addr(), m[1].Addr(), m[2].Addr()}
	pids := map[bson.ObjectID]bool{}
	for i, mem := range m {
		r := helloOf(t, mem)
		mustOK(t, r)
		if strOf(r, "setName") != "rs0" || strOf(r, "me") != mem.Addr() || strOf(r, "primary") != m[0].Addr() {
			t.Fatalf("member %d: %v", i, r)
		}
		if got := stringsOf(t, r, "hosts"); !slices.Equal(got, wantHosts) {
			t.Fatalf("member %d hosts %v, want %v", i, got, wantHosts)
		}
		if got := stringsOf(t, r, "arbiters"); !slices.Equal(got, []string{m[3].Addr()}) {
			t.Fatalf("member %d arbiters %v", i, got)
		}
		wantInt(t, r, "maxWireVersion", DefaultReplicaSetWireVersion)
		wantInt(t, r, "logicalSessionTimeoutMinutes", DefaultLogicalSessionTimeoutMinutes)
		wantInt(t, r, "setVersion", 1)
		wantBool(t, r, "isWritablePrimary", i == 0)
		wantBool(t, r, "secondary", i == 1 || i == 2 || i == 4)
		pid, _ := r.Lookup("topologyVersion", "processId").ObjectIDOK()
		pids[pid] = true
		if i == 0 {
			if id, _ := r.Lookup("electionId").ObjectIDOK(); id != electionID(1) {
				t.Fatalf("electionId %v", id)
			}
		} else {
			wantAbsent(t, r, "electionId")
		}
		if i == 3 {
			wantBool(t, r, "arbiterOnly", true)
			wantAbsent(t, r, "lastWrite")
		} else if _, ok := r.Lookup("lastWrite", "lastWriteDate").DateTimeOK(); !ok {
			t.Fatalf("member %d: no lastWrite.lastWriteDate: %v", i, r)
		}
		if i == 4 {
			wantBool(t, r, "hidden", true)
		} else {
			wantAbsent(t, r, "hidden")
		}
		if i == 1 && strOf(r, "tags", "dc") != "east" || i != 1 && r.Lookup("tags").Type != 0 {
			t.Fatalf("member %d tags: %v", i, r)
		}
	}
	if len(pids) != 5 {
		t.Fatalf("processIds not distinct: %v", pids)
	}

	if err := rs.StepDown(0); err != nil {
		t.Fatal(err)
	}
	for i, mem := range m {
		r := helloOf(t, mem)
		wantBool(t, r, "isWritablePrimary", false)
		wantAbsent(t, r, "primary", "electionId")
		// The old primary's counter rose twice: in the stepdown itself
		// (its "not primary" replies must be newer than its last hello
		// as primary), and with every member's after it.
		want := int64(1)
		if i == 0 {
			want = 2
		}
		if c, _ := r.Lookup("topologyVersion", "counter").AsInt64OK(); c != want {
			t.Fatalf("member %d counter %d after stepdown, want %d", i, c, want)
		}
	}
	if rs.Primary() != nil || m[0].State() != StateSecondary {
		t.Fatalf("primary %v, member 0 %v", rs.Primary(), m[0].State())
	}
	if err := rs.Elect(2); err != nil {
		t.Fatal(err)
	}
	r := helloOf(t, m[2])
	wantBool(t, r, "isWritablePrimary", true)
	first := electionID(1)
	if id, _ := r.Lookup("electionId").ObjectIDOK(); bytes.Compare(id[:], first[:]) <= 0 || id != rs.ElectionID() || rs.Term() != 2 {
		t.Fatalf("electionId %v after a second election (term %d)", id, rs.Term())
	}
	if strOf(helloOf(t, m[1]), "primary") != m[2].Addr() {
		t.Fatal("member 1 does not name the new primary")
	}
	if v := rs.Reconfig(); v != 2 {
		t.Fatalf("setVersion %d", v)
	}
	wantInt(t, helloOf(t, m[0]), "setVersion", 2)

	for _, bad := range []func() error{
		func() error { return rs.Elect(3) },
		func() error { return rs.Elect(4) },
		func() error { return rs.StepDown(0) },
		func() error { return rs.Revive(1) },
		func() error { return rs.Kill(9) },
	} {
		if err := bad(); !errors.Is(err, ErrReplicaSetState) {
			t.Fatalf("err %v, want ErrReplicaSetState", err)
		}
	}
	if rs.Primary() != m[2] {
		t.Fatal("a refused call changed the primary")
	}
}

func TestReplicaSetSecondaryRefusesWritesAndPlainReads(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{Members: 4, Arbiters: []int{3}})
	p, s, arb := dialRaw(t, rs.Member(0).Server()), dialRaw(t, rs.Member(1).Server()), dialRaw(t, rs.Member(3).Server())
	insert := func(id int, extra ...e) d {
		return append(d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: id}}}}, {"$db", "db"}}, extra...)
	}

	// Writes on a secondary: NotWritablePrimary, labelled retryable only
	// for retryable writes, transient inside a transaction.
	r := s.roundTrip(insert(1))
	if codeOf(r) != 10107 || strOf(r, "codeName") != "NotWritablePrimary" || strOf(r, "errmsg") != "not primary" || labelsOf(t, r) != nil {
		t.Fatalf("plain insert on a secondary: %v", r)
	}
	// As on mongod 4.4+, a state-change error carries the member's
	// topologyVersion, the one its hello reports now.
	h := s.roundTrip(d{{"hello", 1}, {"$db", "admin"}})
	if tv, ok := r.Lookup("topologyVersion").DocumentOK(); !ok || !bytes.Equal(tv, h.Lookup("topologyVersion").Document()) {
		t.Fatalf("NotWritablePrimary topologyVersion %v, want hello's %v", r.Lookup("topologyVersion"), h.Lookup("topologyVersion"))
	}
	r = s.roundTrip(insert(1, e{"lsid", session("s-000000000001")}, e{"txnNumber", int64(1)}))
	if codeOf(r) != 10107 || !slices.Equal(labelsOf(t, r), []string{"RetryableWriteError"}) {
		t.Fatalf("retryable insert on a secondary: %v", r)
	}
	r = s.roundTrip(insert(1, e{"lsid", session("s-000000000002")}, e{"txnNumber", int64(1)},
		e{"startTransaction", true}, e{"autocommit", false}))
	if codeOf(r) != 10107 || !slices.Equal(labelsOf(t, r), []string{"TransientTransactionError"}) {
		t.Fatalf("insert in a transaction on a secondary: %v", r)
	}
	if len(rs.Transactions()) != 0 {
		t.Fatalf("a refused transaction was recorded: %+v", rs.Transactions())
	}
	for _, w := range []d{
		{{"update", "c"}, {"updates", bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "u", Value: bson.D{}}}}}, {"$db", "db"}},
		{{"delete", "c"}, {"deletes", bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "limit", Value: 0}}}}, {"$db", "db"}},
		{{"findAndModify", "c"}, {"query", bson.D{}}, {"remove", true}, {"$db", "db"}},
	} {
		if r = s.roundTrip(w); codeOf(r) != 10107 {
			t.Fatalf("%s on a secondary: %v", w[0].Key, r)
		}
	}

	for _, id := range []int{1, 2, 3} {
		mustOK(t, p.roundTrip(insert(id)))
	}

	// Reads on a secondary need a non-primary read preference.
	find := d{{"find", "c"}, {"batchSize", 1}, {"$db", "db"}}
	if r = s.roundTrip(find); codeOf(r) != 13435 || strOf(r, "codeName") != "NotPrimaryNoSecondaryOk" {
		t.Fatalf("find on a secondary without secondaryOk: %v", r)
	}
	if r = s.roundTrip(append(slices.Clone(find), e{"$readPreference", d{{"mode", "primary"}}})); codeOf(r) != 13435 {
		t.Fatalf("find on a secondary with mode primary: %v", r)
	}
	r = s.roundTrip(append(slices.Clone(find), e{"$readPreference", d{{"mode", "secondaryPreferred"}}}))
	mustOK(t, r)
	if strOf(r, ServedByField) != rs.Member(1).Addr() || batchLen(r, "firstBatch") != 1 {
		t.Fatalf("find on a secondary: %v", r)
	}
	secCursor, _ := r.Lookup("cursor", "id").AsInt64OK()
	r = p.roundTrip(find)
	if strOf(r, ServedByField) != rs.Member(0).Addr() {
		t.Fatalf("find on the primary: %v", r)
	}
	primCursor, _ := r.Lookup("cursor", "id").AsInt64OK()
	// Cursor ids stay per member although the data is shared.
	getMore := func(id int64) d {
		return d{{"getMore", id}, {"collection", "c"}, {"$db", "db"}, {"$readPreference", d{{"mode", "secondary"}}}}
	}
	if r = s.roundTrip(getMore(primCursor)); codeOf(r) != codeCursorNotFound {
		t.Fatalf("getMore of the primary's cursor on a secondary: %v", r)
	}
	mustOK(t, s.roundTrip(getMore(secCursor)))

	// An arbiter holds no data.
	if r = arb.roundTrip(append(slices.Clone(find), e{"$readPreference", d{{"mode", "secondary"}}})); codeOf(r) != 13436 {
		t.Fatalf("find on an arbiter: %v", r)
	}
	if r = arb.roundTrip(insert(9)); codeOf(r) != 10107 {
		t.Fatalf("insert on an arbiter: %v", r)
	}
	mustOK(t, arb.roundTrip(d{{"ping", 1}, {"$db", "admin"}}))

	// An unacknowledged write on a secondary closes the connection.
	s.send(wire.FlagMoreToCome, insert(10))
	s.expectClosed(5 * time.Second)
	if n := len(rs.Collection("db", "c")); n != 3 {
		t.Fatalf("%d documents after refused writes, want 3", n)
	}

	// A retryable write retried on the next primary (its reply was lost)
	// is answered without writing twice, as the session table does.
	retry := insert(4, e{"lsid", session("s-000000000003")}, e{"txnNumber", int64(7)})
	mustOK(t, p.roundTrip(retry))
	if err := rs.Elect(2); err != nil {
		t.Fatal(err)
	}
	r = dialRaw(t, rs.Member(2).Server()).roundTrip(retry)
	if n, _ := r.Lookup("n").AsInt64OK(); n != 1 {
		t.Fatalf("retried insert: %v", r)
	}
	if n := len(rs.Collection("db", "c")); n != 4 {
		t.Fatalf("%d documents, want 4 (a retried write was applied twice?)", n)
	}
}

func TestReplicaSetStepDownInterruptsWritesNotReads(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	srv := rs.Member(0).Server()
	setup := dialRaw(t, srv)
	mustOK(t, setup.roundTrip(d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 0}}}}, {"$db", "db"}}))
	// A transaction in progress: a stepdown aborts it.
	mustOK(t, setup.roundTrip(d{{"insert", "t"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 1}}}},
		{"lsid", session("txn-00000000001")}, {"txnNumber", int64(1)}, {"startTransaction", true}, {"autocommit", false}, {"$db", "db"}}))

	srv.SetFailPoint(FailPoint{Mode: FailAlwaysOn, FailCommands: []string{"insert"}, BlockConnection: true, BlockTime: 20 * time.Second})
	const readDelay = 400 * time.Millisecond
	srv.Handle("find", func(req *Request) Reply {
		r := srv.Builtin(req)
		r.Delay = readDelay
		return r
	})
	w, rd := dialRaw(t, srv), dialRaw(t, srv)
	wid := w.send(0, d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 1}}}},
		{"lsid", session("w-000000000001")}, {"txnNumber", int64(1)}, {"$db", "db"}})
	rid := rd.send(0, d{{"find", "c"}, {"$db", "db"}})
	waitFor(t, "the insert and the find to be in flight", func() bool {
		return srv.Requests("insert") == 3 && srv.Requests("find") == 1
	})
	start := time.Now()
	if err := rs.StepDown(0); err != nil {
		t.Fatal(err)
	}
	m := w.recv()
	if m.Header.ResponseTo != wid || codeOf(m.Body) != 11602 || strOf(m.Body, "codeName") != "InterruptedDueToReplStateChange" ||
		!slices.Equal(labelsOf(t, m.Body), []string{"RetryableWriteError"}) {
		t.Fatalf("interrupted insert: %v", m.Body)
	}
	if _, ok := m.Body.Lookup("topologyVersion").DocumentOK(); !ok {
		t.Fatalf("interrupted insert without topologyVersion: %v", m.Body)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the insert was interrupted only after %v", el)
	}
	m = rd.recv()
	if m.Header.ResponseTo != rid || okOf(t, m.Body) != 1 || batchLen(m.Body, "firstBatch") != 1 {
		t.Fatalf("the read in flight did not complete: %v", m.Body)
	}
	// The connection survives; the member now refuses writes.
	srv.SetFailPoint(FailPoint{Mode: FailOff})
	if r := w.roundTrip(d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 2}}}}, {"$db", "db"}}); codeOf(r) != 10107 {
		t.Fatalf("insert after stepdown: %v", r)
	}
	if n := len(rs.Collection("db", "c")); n != 1 {
		t.Fatalf("%d documents: the interrupted write was applied", n)
	}
	txns := rs.Transactions()
	if len(txns) != 1 || txns[0].State != TxnAborted || txns[0].AbortedBy != "stepDown" {
		t.Fatalf("transactions after stepdown: %+v", txns)
	}
}

func TestReplicaSetAwaitableHelloWakesOnStateChange(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	c := dialRaw(t, rs.Member(1).Server())
	first := c.roundTrip(d{{"hello", 1}, {"$db", "admin"}})
	tv, _ := first.Lookup("topologyVersion").DocumentOK()
	id := c.send(wire.FlagExhaustAllowed, d{{"hello", 1}, {"topologyVersion", bson.Raw(tv)}, {"maxAwaitTimeMS", 60_000}, {"$db", "admin"}})
	c.expectNothing(100 * time.Millisecond)

	steps := []struct {
		do          func() error
		wantPrimary string
	}{
		{func() error { return rs.StepDown(0) }, ""},
		{func() error { return rs.Elect(2) }, rs.Member(2).Addr()},
	}
	for i, st := range steps {
		start := time.Now()
		if err := st.do(); err != nil {
			t.Fatal(err)
		}
		m := c.recv()
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("step %d: streamed hello after %v", i, el)
		}
		if m.Header.ResponseTo != id || !m.Flags.Has(wire.FlagMoreToCome) {
			t.Fatalf("step %d: responseTo %d flags %v", i, m.Header.ResponseTo, m.Flags)
		}
		if got := strOf(m.Body, "primary"); got != st.wantPrimary {
			t.Fatalf("step %d: primary %q, want %q", i, got, st.wantPrimary)
		}
		if n, _ := m.Body.Lookup("topologyVersion", "counter").AsInt64OK(); n != int64(i+1) {
			t.Fatalf("step %d: counter %d", i, n)
		}
		id = m.Header.RequestID
	}
}

func TestReplicaSetKillRevive(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	m1 := rs.Member(1)
	before := helloOf(t, m1)
	pid0, _ := before.Lookup("topologyVersion", "processId").ObjectIDOK()
	c := dialRaw(t, m1.Server())
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}}))

	if err := rs.Kill(1); err != nil {
		t.Fatal(err)
	}
	c.expectClosed(5 * time.Second)
	if nc, err := net.DialTimeout("tcp", m1.Addr(), time.Second); err == nil {
		_ = nc.Close()
		t.Fatal("a killed member accepted a connection")
	}
	if m1.State() != StateDown || rs.Primary() != rs.Member(0) {
		t.Fatalf("after kill: member 1 %v, primary %v", m1.State(), rs.Primary())
	}
	if got := stringsOf(t, helloOf(t, rs.Member(0)), "hosts"); !slices.Contains(got, m1.Addr()) {
		t.Fatalf("a dead member left the configuration: %v", got)
	}

	if err := rs.Revive(1); err != nil {
		t.Fatal(err)
	}
	after := helloOf(t, m1)
	pid1, _ := after.Lookup("topologyVersion", "processId").ObjectIDOK()
	if pid1 == pid0 || m1.Server().ProcessID() != pid1 || strOf(after, "me") != m1.Addr() {
		t.Fatalf("revived member: processId %v (was %v): %v", pid1, pid0, after)
	}
	wantBool(t, after, "secondary", true)
	if n := m1.Requests("hello"); n != 2 {
		t.Fatalf("hello counted %d times across lives, want 2", n)
	}

	// Killing the primary leaves the set without one until an election.
	if err := rs.Kill(0); err != nil {
		t.Fatal(err)
	}
	if rs.Primary() != nil {
		t.Fatal("a killed primary is still primary")
	}
	if r := helloOf(t, m1); r.Lookup("primary").Type != 0 {
		t.Fatalf("secondary still names the dead primary: %v", r)
	}
	if err := rs.Elect(0); !errors.Is(err, ErrReplicaSetState) {
		t.Fatalf("electing a dead member: %v", err)
	}
	if got, err := rs.Failover(); err == nil || got != -1 {
		t.Fatalf("failover without a primary: %d %v", got, err)
	}
}

func TestReplicaSetStepDownDuringAWriteThatIsNotWaiting(t *testing.T) {
	// A stepdown that lands while a write runs (not in a wait) must not
	// leave the connection unusable: the write completes, as it would had
	// it finished just before the stepdown, and the next request works.
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	srv := rs.Member(0).Server()
	running, release := make(chan struct{}), make(chan struct{})
	srv.Handle("insert", func(req *Request) Reply {
		close(running)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		return srv.Builtin(req)
	})
	c := dialRaw(t, srv)
	id := c.send(0, d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 1}}}}, {"$db", "db"}})
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the insert never ran")
	}
	if err := rs.StepDown(0); err != nil {
		t.Fatal(err)
	}
	close(release)
	if m := c.recv(); m.Header.ResponseTo != id || okOf(t, m.Body) != 1 {
		t.Fatalf("insert: %v", m.Body)
	}
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}}))
	if r := c.roundTrip(d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 2}}}}, {"$db", "db"}}); codeOf(r) != 10107 {
		t.Fatalf("insert after stepdown: %v", r)
	}
}

func TestReplicaSetHandlerKillTakesMemberDown(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	srv := rs.Member(0).Server()
	srv.Handle("ping", func(*Request) Reply { return Reply{Kill: true} })
	c := dialRaw(t, srv)
	c.send(0, d{{"ping", 1}, {"$db", "admin"}})
	c.expectClosed(5 * time.Second)
	if rs.Member(0).State() != StateDown || rs.Primary() != nil {
		t.Fatalf("member 0 %v, primary %v", rs.Member(0).State(), rs.Primary())
	}
	if err := rs.Revive(0); err != nil {
		t.Fatal(err)
	}
	mustOK(t, dialRaw(t, rs.Member(0).Server()).roundTrip(d{{"ping", 1}, {"$db", "admin"}}))
	if rs.Member(0).State() != StateSecondary {
		t.Fatalf("revived as %v", rs.Member(0).State())
	}
}

func TestReplicaSetPausedReplication(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	p := dialRaw(t, rs.Member(0).Server())
	insert := func(id int) d {
		return d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: id}}}}, {"$db", "db"}}
	}
	countOn := func(i int) int {
		r := dialRaw(t, rs.Member(i).Server()).roundTrip(d{{"find", "c"}, {"$db", "db"}, {"$readPreference", d{{"mode", "secondaryPreferred"}}}})
		mustOK(t, r)
		return batchLen(r, "firstBatch")
	}
	lastWrite := func(i int) bson.DateTime {
		v, ok := helloOf(t, rs.Member(i)).Lookup("lastWrite", "lastWriteDate").DateTimeOK()
		if !ok {
			t.Fatalf("member %d: no lastWriteDate", i)
		}
		return bson.DateTime(v)
	}
	mustOK(t, p.roundTrip(insert(1)))
	if err := rs.PauseReplication(1); err != nil {
		t.Fatal(err)
	}
	if err := rs.PauseReplication(0); !errors.Is(err, ErrReplicaSetState) {
		t.Fatalf("pausing the primary: %v", err)
	}
	time.Sleep(5 * time.Millisecond) // let the clock move past the paused lastWriteDate
	mustOK(t, p.roundTrip(insert(2)))
	if a, b, c := countOn(0), countOn(1), countOn(2); a != 2 || b != 1 || c != 2 {
		t.Fatalf("documents seen: primary %d, paused %d, other %d", a, b, c)
	}
	if lw0, lw1 := lastWrite(0), lastWrite(1); lw1 >= lw0 || lastWrite(2) != lw0 {
		t.Fatalf("lastWriteDate: primary %v, paused %v", lw0, lw1)
	}
	if err := rs.ResumeReplication(1); err != nil {
		t.Fatal(err)
	}
	if n := countOn(1); n != 2 || lastWrite(1) != lastWrite(0) {
		t.Fatalf("after resume: %d documents", n)
	}

	// A paused member catches up before it wins an election.
	if err := rs.PauseReplication(2); err != nil {
		t.Fatal(err)
	}
	mustOK(t, p.roundTrip(insert(3)))
	if n := countOn(2); n != 2 {
		t.Fatalf("paused member sees %d documents", n)
	}
	if err := rs.Elect(2); err != nil {
		t.Fatal(err)
	}
	if n := countOn(2); n != 3 {
		t.Fatalf("elected member sees %d documents, want 3", n)
	}
}

// MaxWireVersions sets one member's maxWireVersion, in every life; the
// others keep Base's (or the default).
func TestReplicaSetMemberWireVersions(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{MaxWireVersions: map[int]int32{2: 17}})
	for i, want := range []int64{DefaultReplicaSetWireVersion, DefaultReplicaSetWireVersion, 17} {
		wantInt(t, helloOf(t, rs.Member(i)), "maxWireVersion", want)
	}
	if err := rs.Kill(2); err != nil {
		t.Fatal(err)
	}
	if err := rs.Revive(2); err != nil {
		t.Fatal(err)
	}
	wantInt(t, helloOf(t, rs.Member(2)), "maxWireVersion", 17)
	if _, err := NewReplicaSet(ReplicaSetOptions{MaxWireVersions: map[int]int32{3: 17}}); err == nil {
		t.Fatal("a wire version for member 3 of 3 was accepted")
	}
}

// The moment between a state change and bumpAll's wake-up: a demoted
// primary's "not primary" is already newer than its last hello as primary
// (else SDAM discards it as stale and a driver's retry goes back to it),
// and a member marked down answers nothing, as a killed process would.
func TestReplicaSetStateChangeIsNewerThanItsHellos(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	m := rs.Member(0)
	c := dialRaw(t, m.Server())
	insert := d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 1}}}}, {"$db", "db"}}
	before, _ := helloOf(t, m).Lookup("topologyVersion", "counter").AsInt64OK()

	rs.mu.Lock()
	rs.setPrimaryLocked(-1) // no bumpAll yet
	rs.mu.Unlock()
	r := c.roundTrip(insert)
	if codeOf(r) != 10107 {
		t.Fatalf("insert on the demoted primary: %v", r)
	}
	if after, _ := r.Lookup("topologyVersion", "counter").AsInt64OK(); after <= before {
		t.Fatalf("not primary at counter %d, its last hello as primary said %d: stale by SDAM's rule", after, before)
	}

	rs.mu.Lock()
	m.down = true // killed, its connections not yet closed
	rs.mu.Unlock()
	c.send(0, insert)
	c.expectClosed(2 * time.Second)
	rs.mu.Lock()
	m.down = false
	rs.mu.Unlock()
}
