package sdam

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestHandleAppError(t *testing.T) {
	tv1 := &TopologyVersion{ProcessID: bson.ObjectID{1}, Counter: 1}
	tv2 := &TopologyVersion{ProcessID: bson.ObjectID{1}, Counter: 2}
	primary := ServerDescription{Address: "a:1", Type: RSPrimary, SetName: "rs", TopologyVersion: tv1}
	cause := errors.New("the cause")
	sid := &bson.ObjectID{7}
	cmd := func(code int32, msg string) AppError {
		return AppError{Kind: CommandError, HasCode: code != 0, Code: code, Message: msg, HandshakeCompleted: true, Generation: 3, Err: cause}
	}
	type want struct {
		stale, unknown, clear, check, cancel bool
		tv                                   *TopologyVersion
	}
	for _, tc := range []struct {
		name string
		tt   TopologyType
		e    AppError
		want want
	}{
		{"stale generation", ReplicaSetWithPrimary,
			AppError{Kind: NetworkError, HandshakeCompleted: true, Generation: 2}, want{stale: true}},
		{"network error", ReplicaSetWithPrimary,
			AppError{Kind: NetworkError, HandshakeCompleted: true, Generation: 3, Err: cause}, want{unknown: true, clear: true, cancel: true}},
		{"timeout after handshake", ReplicaSetWithPrimary,
			AppError{Kind: NetworkTimeout, HandshakeCompleted: true, Generation: 3}, want{}},
		{"timeout before handshake", ReplicaSetWithPrimary,
			AppError{Kind: NetworkTimeout, Generation: 3, Err: cause}, want{unknown: true, clear: true, cancel: true}},
		{"overloaded before handshake", ReplicaSetWithPrimary,
			AppError{Kind: NetworkError, SystemOverloaded: true, Generation: 3}, want{}},
		{"auth failure", ReplicaSetWithPrimary,
			AppError{Kind: CommandError, HasCode: true, Code: 18, Generation: 3, Err: cause}, want{unknown: true, clear: true, cancel: true}},
		{"ordinary command error", ReplicaSetWithPrimary, cmd(11000, "duplicate key"), want{}},
		{"not writable primary", ReplicaSetWithPrimary, cmd(10107, ""), want{unknown: true, check: true}},
		{"recovering", ReplicaSetWithPrimary, cmd(189, ""), want{unknown: true, check: true}},
		{"shutdown", ReplicaSetWithPrimary, cmd(91, ""), want{unknown: true, check: true, clear: true}},
		{"interrupted at shutdown", Single, cmd(11600, ""), want{unknown: true, check: true, clear: true}},
		{"code wins over message", ReplicaSetWithPrimary, cmd(1, "not master"), want{}},
		{"legacy not master", ReplicaSetWithPrimary, cmd(0, "not master"), want{unknown: true, check: true}},
		{"legacy not master or secondary", ReplicaSetWithPrimary, cmd(0, "not master or secondary"), want{unknown: true, check: true}},
		{"legacy node is recovering", ReplicaSetWithPrimary, cmd(0, "node is recovering"), want{unknown: true, check: true}},
		{"legacy other message", ReplicaSetWithPrimary, cmd(0, "something else"), want{}},
		{"newer topologyVersion", ReplicaSetWithPrimary,
			func() AppError { e := cmd(10107, ""); e.TopologyVersion = tv2; return e }(), want{unknown: true, check: true, tv: tv2}},
		{"equal topologyVersion", ReplicaSetWithPrimary,
			func() AppError { e := cmd(91, ""); e.TopologyVersion = tv1; return e }(), want{stale: true}},
		{"load balanced state change", LoadBalanced, cmd(10107, ""), want{check: true}},
		{"load balanced shutdown", LoadBalanced, cmd(91, ""), want{check: true, clear: true}},
		{"load balanced network error", LoadBalanced,
			AppError{Kind: NetworkError, HandshakeCompleted: true, Generation: 3, ServiceID: sid}, want{clear: true}},
		{"load balanced handshake error without serviceId", LoadBalanced,
			AppError{Kind: NetworkError, Generation: 3}, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := primary
			if tc.tt == LoadBalanced {
				cur = LoadBalancerServer("a:1")
			}
			a := HandleAppError(cur, tc.tt, 3, tc.e)
			got := want{a.Stale, a.MarkUnknown, a.ClearPool, a.RequestCheck, a.CancelCheck, a.Unknown.TopologyVersion}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if a.InterruptInUse || a.CheckAgainNow {
				t.Errorf("an application error interrupts or re-checks: %+v", a)
			}
			if a.MarkUnknown {
				if a.Unknown.Type != Unknown || a.Unknown.Address != "a:1" || a.Unknown.Error == nil {
					t.Errorf("unknown %+v", a.Unknown)
				}
				if tc.e.Err != nil && a.Unknown.Error != tc.e.Err {
					t.Errorf("error %v, want the cause", a.Unknown.Error)
				}
			} else if a.Unknown.Address != "" {
				t.Errorf("a description without MarkUnknown: %+v", a.Unknown)
			}
		})
	}
}

func TestConnectFailure(t *testing.T) {
	primary := ServerDescription{Address: "a:1", Type: RSPrimary, SetName: "rs"}
	cause := errors.New("x")
	for _, tc := range []struct {
		name        string
		stage       Stage
		io, timeout bool
		kind        ErrorKind
		ignored     bool
	}{
		{"connect reset", StageDial, true, false, NetworkError, true},
		{"connect timeout", StageDial, true, true, NetworkTimeout, true},
		{"TLS handshake EOF", StageTLS, true, false, NetworkError, true},
		{"hello timeout", StageHello, true, true, NetworkTimeout, true},
		{"hello closed", StageHello, true, false, NetworkError, true},
		{"auth connection closed", StageAuth, true, false, NetworkError, false},
		{"auth timeout", StageAuth, true, true, NetworkTimeout, false},
		{"auth refused", StageAuth, false, false, NetworkError, false},
		{"name does not resolve", StageDial, false, false, NetworkError, false},
		{"certificate does not verify", StageTLS, false, false, NetworkError, false},
		{"unusable hello", StageHello, false, false, NetworkError, false},
	} {
		e := ConnectFailure(tc.stage, tc.io, tc.timeout, 3, cause)
		if e.Kind != tc.kind || e.HandshakeCompleted || e.Generation != 3 || e.Err != cause || e.SystemOverloaded != tc.ignored {
			t.Errorf("%s: %+v", tc.name, e)
		}
		a := HandleAppError(primary, ReplicaSetWithPrimary, 3, e)
		acted := a.Stale || a.MarkUnknown || a.ClearPool || a.RequestCheck || a.CancelCheck
		if tc.ignored == acted || tc.ignored == (a.MarkUnknown && a.ClearPool) {
			t.Errorf("%s: %+v", tc.name, a)
		}
	}
}

func TestCheckFailed(t *testing.T) {
	known := ServerDescription{Address: "a:1", Type: RSSecondary}
	unknown := ServerDescription{Address: "a:1"}
	cause := errors.New("x")
	for _, tc := range []struct {
		name             string
		cur              ServerDescription
		kind             ErrorKind
		interrupt, again bool
	}{
		{"network, was known", known, NetworkError, false, true},
		{"network, was unknown", unknown, NetworkError, false, false},
		{"timeout, was known", known, NetworkTimeout, true, true},
		{"command error", known, CommandError, false, false},
	} {
		a := CheckFailed(tc.cur, tc.kind, cause)
		if !a.MarkUnknown || !a.ClearPool || a.Unknown.Error != cause || a.Unknown.Type != Unknown || a.Unknown.Address != "a:1" {
			t.Errorf("%s: %+v", tc.name, a)
		}
		if a.InterruptInUse != tc.interrupt || a.CheckAgainNow != tc.again || a.Stale || a.RequestCheck {
			t.Errorf("%s: interrupt %v again %v (%+v)", tc.name, a.InterruptInUse, a.CheckAgainNow, a)
		}
	}
}

func TestCommandErrorFromReply(t *testing.T) {
	tv := bson.D{{Key: "processId", Value: bson.ObjectID{1}}, {Key: "counter", Value: int64(5)}}
	e, ok := CommandErrorFromReply(doc(t, bson.D{
		{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not primary"}, {Key: "code", Value: 10107}, {Key: "topologyVersion", Value: tv},
	}))
	if !ok || e.Kind != CommandError || !e.HasCode || e.Code != 10107 || e.Message != "not primary" ||
		e.TopologyVersion == nil || e.TopologyVersion.Counter != 5 {
		t.Errorf("ok:0 reply: %v %+v", ok, e)
	}
	e, ok = CommandErrorFromReply(doc(t, bson.D{
		{Key: "ok", Value: 1}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: 91}, {Key: "errmsg", Value: "shutting down"}}},
	}))
	if !ok || e.Code != 91 || !e.HasCode || e.Message != "shutting down" {
		t.Errorf("writeConcernError: %v %+v", ok, e)
	}
	e, ok = CommandErrorFromReply(doc(t, bson.D{{Key: "ok", Value: 0}, {Key: "errmsg", Value: "not master"}}))
	if !ok || e.HasCode || e.Message != "not master" || !IsStateChangeError(e.Code, e.HasCode, e.Message) {
		t.Errorf("legacy: %v %+v", ok, e)
	}
	for name, reply := range map[string][]byte{
		"writeErrors only": doc(t, bson.D{{Key: "ok", Value: 1}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "code", Value: 10107}}}}}),
		"success":          doc(t, bson.D{{Key: "ok", Value: 1}}),
		"not BSON":         []byte{1, 2, 3},
	} {
		if e, ok := CommandErrorFromReply(reply); ok {
			t.Errorf("%s: found %+v", name, e)
		}
	}
}

func TestErrorCodeHelpers(t *testing.T) {
	if !IsShutdownError(91) || !IsShutdownError(11600) || IsShutdownError(189) {
		t.Error("IsShutdownError")
	}
	if !IsStateChangeError(13436, true, "") || IsStateChangeError(6, true, "not master") || IsStateChangeError(0, false, "boom") {
		t.Error("IsStateChangeError")
	}
}
