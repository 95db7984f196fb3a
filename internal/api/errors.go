package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// Error codes of the HTTP API that are not solver codes.
const (
	CodeNotFound       = "not_found"
	CodeConflict       = "conflict"
	CodeUnavailable    = "unavailable"
	CodeInternal       = "internal"
	CodeBodyTooLarge   = "body_too_large"
	CodeIncomplete     = "incomplete"
	CodeTooManyRequest = "rate_limited"
)

// Error is the body of every error response:
// {"error": {"code": "...", "message": "...", "field": "..."}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

type errorBody struct {
	Error Error `json:"error"`
}

// apiError is an error with its HTTP status decided where it arises.
type apiError struct {
	status int
	Error_ Error
}

func (e *apiError) Error() string { return e.Error_.Message }

func newError(status int, code, field, format string, args ...any) *apiError {
	return &apiError{status: status, Error_: Error{Code: code, Message: fmt.Sprintf(format, args...), Field: field}}
}

// errConflict is returned when a task or batch has already ended.
var errConflict = errors.New("already ended")

// statusOf maps every domain error to its HTTP status and body. It is the
// only place that does, so the same failure always gets the same answer.
func statusOf(err error) (int, Error) {
	var (
		ae *apiError
		ie *solvers.InputError
		mb *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.Error_
	case errors.As(err, &mb):
		return http.StatusRequestEntityTooLarge, Error{Code: CodeBodyTooLarge,
			Message: fmt.Sprintf("request body is larger than %d bytes", mb.Limit)}
	case errors.As(err, &ie):
		code := ie.Code
		if code == "" {
			code = puzzle.CodeInvalidRequest
		}
		return http.StatusBadRequest, Error{Code: code, Message: ie.Error(), Field: ie.Field}
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, Error{Code: CodeNotFound, Message: "no such task or batch"}
	case errors.Is(err, errConflict):
		return http.StatusConflict, Error{Code: CodeConflict, Message: err.Error()}
	case errors.Is(err, context.Canceled):
		// The client went away; the status is never seen.
		return 499, Error{Code: CodeUnavailable, Message: "request canceled"}
	default:
		// Anything else comes from Redis or the queue: the service is not
		// able to answer now, and the client may retry.
		return http.StatusServiceUnavailable, Error{Code: CodeUnavailable,
			Message: "the service is temporarily unavailable; retry later"}
	}
}

// fail writes err as the response and records it for the access log.
func fail(c *gin.Context, err error) {
	status, body := statusOf(err)
	if status >= 500 {
		c.Header("Retry-After", "1")
	}
	_ = c.Error(err)
	c.AbortWithStatusJSON(status, errorBody{body})
}
