package fakemongo

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FailMode says when a fail point fires.
type FailMode int

const (
	// FailOff disables the fail point.
	FailOff FailMode = iota
	// FailAlwaysOn fires on every matching command.
	FailAlwaysOn
	// FailTimes fires on the next FailPoint.Times matching commands, then
	// turns itself off.
	FailTimes
)

// FailPoint is the failCommand fail point of real servers (the subset the
// drivers' spec tests use). A command matches when its name is in
// FailCommands and, if AppName is set, the connection's application name is
// AppName. A matching command is, in this order: delayed by BlockTime if
// BlockConnection; dropped with its connection closed if CloseConnection;
// answered with ErrorCode (and ErrorLabels) if ErrorCode is not 0; otherwise
// executed normally.
type FailPoint struct {
	// Mode says when the fail point fires.
	Mode FailMode
	// Times is the number of matching commands to fail with FailTimes.
	Times int
	// FailCommands are the command names to fail, matched exactly as sent
	// (list both "hello" and "isMaster" to catch every handshake).
	FailCommands []string
	// CloseConnection closes the connection instead of replying.
	CloseConnection bool
	// BlockConnection delays the command by BlockTime.
	BlockConnection bool
	// BlockTime is the delay of BlockConnection.
	BlockTime time.Duration
	// ErrorCode, when not 0, is the error code to answer with.
	ErrorCode int32
	// ErrorLabels are added to the ErrorCode reply.
	ErrorLabels []string
	// AppName restricts the fail point to connections whose hello sent this
	// client.application.name.
	AppName string
}

// OverloadFailPoint returns a fail point that refuses the next n of cmds as
// an overloaded MongoDB 8.2 does: code 462 (IngressRequestRateLimitExceeded)
// with the labels SystemOverloadedError and RetryableError. n <= 0 refuses
// every one until the fail point is cleared.
func OverloadFailPoint(n int, cmds ...string) FailPoint {
	fp := FailPoint{Mode: FailTimes, Times: n, FailCommands: cmds, ErrorCode: CodeOverloaded, ErrorLabels: OverloadLabels}
	if n <= 0 {
		fp.Mode, fp.Times = FailAlwaysOn, 0
	}
	return fp
}

// ErrBadFailPoint is returned (wrapped) by ParseFailPoint for a
// configureFailPoint command the fake does not understand.
var ErrBadFailPoint = errors.New("fakemongo: unsupported configureFailPoint")

// SetFailPoint installs fp, replacing the previous fail point (there is one
// failCommand fail point per server, as on a real server). A fail point with
// Mode FailOff, or FailTimes with Times <= 0, clears it.
func (s *Server) SetFailPoint(fp FailPoint) {
	fp.FailCommands = slices.Clone(fp.FailCommands)
	fp.ErrorLabels = slices.Clone(fp.ErrorLabels)
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	if fp.Mode == FailOff || (fp.Mode == FailTimes && fp.Times <= 0) {
		s.fp = FailPoint{}
		s.fpArmed.Store(false)
		return
	}
	s.fp = fp
	s.fpArmed.Store(true)
}

// ClearFailPoint turns the fail point off.
func (s *Server) ClearFailPoint() { s.SetFailPoint(FailPoint{}) }

// FailPointState returns the current fail point; for FailTimes, Times is the
// number of firings left.
func (s *Server) FailPointState() FailPoint {
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	fp := s.fp
	fp.FailCommands = slices.Clone(fp.FailCommands)
	fp.ErrorLabels = slices.Clone(fp.ErrorLabels)
	return fp
}

// FailPointHits returns how many commands the fail point has fired on since
// the server started.
func (s *Server) FailPointHits() int64 { return s.fpHits.Load() }

// failAction is what a fired fail point asks the connection to do. It is a
// copy taken under fpMu so the connection never reads s.fp unlocked.
type failAction struct {
	block     time.Duration
	close     bool
	errorCode int32
	labels    []string
}

// checkFailPoint reports whether the fail point fires for a command and, if
// so, consumes one firing.
func (s *Server) checkFailPoint(cmd, appName string) (failAction, bool) {
	if !s.fpArmed.Load() {
		return failAction{}, false
	}
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	fp := &s.fp
	if fp.Mode == FailOff || !slices.Contains(fp.FailCommands, cmd) {
		return failAction{}, false
	}
	if fp.AppName != "" && fp.AppName != appName {
		return failAction{}, false
	}
	a := failAction{close: fp.CloseConnection, errorCode: fp.ErrorCode, labels: fp.ErrorLabels}
	if fp.BlockConnection {
		a.block = fp.BlockTime
	}
	if fp.Mode == FailTimes {
		fp.Times--
		if fp.Times <= 0 {
			s.fp = FailPoint{}
			s.fpArmed.Store(false)
		}
	}
	s.fpHits.Add(1)
	return a, true
}

// ParseFailPoint decodes a configureFailPoint command body such as
//
//	{configureFailPoint: "failCommand", mode: {times: 2},
//	 data: {failCommands: ["hello"], errorCode: 91, appName: "x"}}
//
// Only the failCommand fail point and the data fields of FailPoint are
// accepted (plus failInternalCommands, which the fake has no use for);
// anything else is an error wrapping ErrBadFailPoint, so a test never
// silently runs against a fail point the fake ignores.
func ParseFailPoint(body bsoncore.Document) (FailPoint, error) {
	var fp FailPoint
	name, ok := body.Lookup("configureFailPoint").StringValueOK()
	if !ok || name != "failCommand" {
		return fp, fmt.Errorf("%w: only the failCommand fail point is supported", ErrBadFailPoint)
	}
	mode := body.Lookup("mode")
	if s, ok := mode.StringValueOK(); ok {
		switch s {
		case "alwaysOn":
			fp.Mode = FailAlwaysOn
		case "off":
			fp.Mode = FailOff
		default:
			return fp, fmt.Errorf("%w: mode %q", ErrBadFailPoint, s)
		}
	} else if d, ok := mode.DocumentOK(); ok {
		n, ok := d.Lookup("times").AsInt64OK()
		if !ok {
			return fp, fmt.Errorf("%w: mode document must be {times: N}", ErrBadFailPoint)
		}
		if n < 0 || n > 1<<31 {
			return fp, fmt.Errorf("%w: times %d out of range", ErrBadFailPoint, n)
		}
		fp.Mode, fp.Times = FailTimes, int(n)
	} else {
		return fp, fmt.Errorf("%w: missing mode", ErrBadFailPoint)
	}
	data, ok := body.Lookup("data").DocumentOK()
	if !ok {
		if fp.Mode == FailOff {
			return fp, nil
		}
		return fp, fmt.Errorf("%w: missing data", ErrBadFailPoint)
	}
	elems, err := data.Elements()
	if err != nil {
		return fp, fmt.Errorf("%w: data: %v", ErrBadFailPoint, err)
	}
	for _, e := range elems {
		v := e.Value()
		switch k := e.Key(); k {
		case "failCommands":
			fp.FailCommands, err = stringArray(v)
		case "closeConnection":
			fp.CloseConnection, ok = v.BooleanOK()
			err = typeErr(ok, k)
		case "blockConnection":
			fp.BlockConnection, ok = v.BooleanOK()
			err = typeErr(ok, k)
		case "blockTimeMS":
			var ms int64
			ms, ok = v.AsInt64OK()
			if ok && (ms < 0 || ms > int64(time.Hour/time.Millisecond)) {
				ok = false
			}
			fp.BlockTime = time.Duration(ms) * time.Millisecond
			err = typeErr(ok, k)
		case "errorCode":
			var c int64
			c, ok = v.AsInt64OK()
			fp.ErrorCode = int32(c)
			err = typeErr(ok && c == int64(int32(c)), k)
		case "errorLabels":
			fp.ErrorLabels, err = stringArray(v)
		case "appName":
			fp.AppName, ok = v.StringValueOK()
			err = typeErr(ok, k)
		case "failInternalCommands":
		default:
			err = fmt.Errorf("%w: data field %q", ErrBadFailPoint, k)
		}
		if err != nil {
			return fp, err
		}
	}
	if fp.Mode != FailOff && len(fp.FailCommands) == 0 {
		return fp, fmt.Errorf("%w: data.failCommands is empty", ErrBadFailPoint)
	}
	return fp, nil
}

func typeErr(ok bool, key string) error {
	if ok {
		return nil
	}
	return fmt.Errorf("%w: bad value for data.%s", ErrBadFailPoint, key)
}

// stringArray decodes a BSON array of strings.
func stringArray(v bsoncore.Value) ([]string, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("%w: expected an array of strings", ErrBadFailPoint)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFailPoint, err)
	}
	out := make([]string, 0, len(vals))
	for _, x := range vals {
		s, ok := x.StringValueOK()
		if !ok {
			return nil, fmt.Errorf("%w: expected an array of strings", ErrBadFailPoint)
		}
		out = append(out, s)
	}
	return out, nil
}
