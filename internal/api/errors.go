package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/solvers"
)

// apiError is an error with its HTTP status decided where it arises. Every
// error answer's body is an apitype.ErrorBody around its Error_.
type apiError struct {
	status int
	Error_ apitype.Error
}

func (e *apiError) Error() string { return e.Error_.Message }

func newError(status int, code, field, format string, args ...any) *apiError {
	return &apiError{status: status, Error_: apitype.Error{Code: code, Message: fmt.Sprintf(format, args...), Field: field}}
}

// statusOf maps every domain error to its HTTP status and body. It is the
// only place that does, so the same failure always gets the same answer.
func statusOf(err error) (int, apitype.Error) {
	var (
		ae *apiError
		ie *solvers.InputError
		mb *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.Error_
	case errors.As(err, &mb):
		return http.StatusRequestEntityTooLarge, apitype.Error{Code: apitype.CodeBodyTooLarge,
			Message: fmt.Sprintf("request body is larger than %d bytes", mb.Limit)}
	case errors.As(err, &ie):
		code := ie.Code
		if code == "" {
			code = apitype.CodeInvalidRequest
		}
		return http.StatusBadRequest, apitype.Error{Code: code, Message: ie.Error(), Field: ie.Field}
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, apitype.Error{Code: apitype.CodeNotFound, Message: "no such task or batch"}
	case errors.Is(err, admission.ErrKeyShareFull) && !errors.Is(err, context.Canceled):
		// A read waited out its time for room that its own key's other
		// requests held: the key can make room, the service is not
		// unavailable.
		return errKeyShare.status, errKeyShare.Error_
	case errors.Is(err, context.Canceled):
		// The client went away; the status is never seen.
		return 499, apitype.Error{Code: apitype.CodeUnavailable, Message: "request canceled"}
	default:
		// Anything else comes from Redis or the queue: the service is not
		// able to answer now, and the client may retry.
		return http.StatusServiceUnavailable, apitype.Error{Code: apitype.CodeUnavailable,
			Message: "the service is temporarily unavailable; retry later"}
	}
}

// fail writes err as the response and records it for the access log.
func fail(c *gin.Context, err error) {
	status, body := statusOf(err)
	if status >= 500 || errors.Is(err, admission.ErrKeyShareFull) || errors.Is(err, errKeyShare) {
		c.Header("Retry-After", "1")
	}
	_ = c.Error(err)
	c.AbortWithStatusJSON(status, apitype.ErrorBody{Error: body})
}
