package admin

import (
	"errors"
	"fmt"
	"net/http"
)

// MongoDB error codes the admin interface answers with. Drivers and mongosh
// show codeName next to errmsg, so each code keeps its server name.
const (
	CodeBadValue        int32 = 2
	CodeInternalError   int32 = 1
	CodeUnauthorized    int32 = 13
	CodeCommandNotFound int32 = 59
	CodeOperationFailed int32 = 96
)

var codeNames = map[int32]string{
	CodeInternalError:   "InternalError",
	CodeBadValue:        "BadValue",
	CodeUnauthorized:    "Unauthorized",
	CodeCommandNotFound: "CommandNotFound",
	CodeOperationFailed: "OperationFailed",
}

// ErrUnknownRoute is what a Controller wraps (errors.Is) when Pause, Resume
// or Reconnect name a route that does not exist, so the admin interface can
// answer BadValue (HTTP 400) instead of OperationFailed (HTTP 500).
var ErrUnknownRoute = errors.New("unknown route")

// Error is an admin command failure as a MongoDB error: Code and CodeName go
// into the reply's code and codeName, Msg (prefixed "mongobouncer: ") into
// errmsg. A Controller may return an *Error (or wrap one) to choose the code
// itself; any other error from an action becomes OperationFailed.
type Error struct {
	Code int32
	Msg  string
}

// Error implements error.
func (e *Error) Error() string { return e.Msg }

// CodeName is the MongoDB name of e.Code ("UnknownError" when unknown).
func (e *Error) CodeName() string {
	if n, ok := codeNames[e.Code]; ok {
		return n
	}
	return "UnknownError"
}

// httpStatus maps the error onto the closest HTTP status for /admin/...
func (e *Error) httpStatus() int {
	switch e.Code {
	case CodeBadValue:
		return http.StatusBadRequest
	case CodeUnauthorized:
		return http.StatusForbidden
	case CodeCommandNotFound:
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

func errorf(code int32, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// asAdminError classifies an error returned by the Controller.
func asAdminError(err error) *Error {
	var ae *Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, ErrUnknownRoute):
		return &Error{Code: CodeBadValue, Msg: err.Error()}
	}
	return &Error{Code: CodeOperationFailed, Msg: err.Error()}
}
