package apitype

// Error codes of an Error (the body of a 4xx or 5xx answer). They are
// part of the contract: programs branch on them, so they never change.
const (
	// CodeInvalidRequest: the request is not well formed (bad JSON, an
	// unknown kind or field, a bad query parameter or header).
	CodeInvalidRequest = "invalid_request"
	// CodeInvalidPuzzle: the puzzle is well formed but breaks a rule of
	// its kind. Also a task failure code.
	CodeInvalidPuzzle = "invalid_puzzle"
	// CodeTooLarge: the puzzle or the batch is over a size limit.
	CodeTooLarge = "too_large"
	// CodeBodyTooLarge: the request body is over the server's byte limit.
	CodeBodyTooLarge = "body_too_large"
	// CodeRequestTimeout: the request body did not arrive within the
	// server's read deadline (408); send it again, faster.
	CodeRequestTimeout = "request_timeout"
	// CodeNotFound: no such task, batch or route (or another key's).
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed: the route exists with another method.
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeConflict: the task or batch has already ended.
	CodeConflict = "conflict"
	// CodeIncomplete: the batch's output needs every task completed.
	CodeIncomplete = "incomplete"
	// CodeUnauthorized: API keys are configured and the request has no
	// valid one.
	CodeUnauthorized = "unauthorized"
	// CodeForbidden: the key is valid but not for this route: a tenant
	// key on an operator route (/monitoring, /metrics), or an operator
	// key on /v1; or a state-changing request authenticated by the
	// dashboard's session cookie lacks the dashboard's header or comes
	// from another site (CSRF protection).
	CodeForbidden = "forbidden"
	// CodeRateLimited: the API key's request rate is over its limit, its
	// requests in progress hold all the memory the key may (a body that
	// waited 1 s for it), or the client's address failed
	// authentication too often.
	CodeRateLimited = "rate_limited"
	// CodeQuotaExceeded: the API key has too many unfinished tasks.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeIdempotencyKeyReused: the Idempotency-Key was used with another
	// body.
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	// CodeInProgress: a request with the same Idempotency-Key is still
	// being processed; retry shortly.
	CodeInProgress = "in_progress"
	// CodeUnavailable: Redis or the queue is not answering; retry later.
	CodeUnavailable = "unavailable"
	// CodeInternal: a bug, logged by the server. Also a task failure code.
	CodeInternal = "internal"
)

// Failure codes of a TaskError, besides CodeInvalidPuzzle and
// CodeInternal.
const (
	// CodeBudgetExceeded: the search ran out of its node budget; retrying
	// cannot help.
	CodeBudgetExceeded = "budget_exceeded"
	// CodeTimeout: the solve passed its kind's deadline.
	CodeTimeout = "timeout"
	// CodeCanceled: the task was canceled by request.
	CodeCanceled = "canceled"
	// CodeExpired: a batch item whose record expired before its batch.
	CodeExpired = "expired"
)

// ErrorCodes returns every code an Error may carry.
func ErrorCodes() []string {
	return []string{CodeInvalidRequest, CodeInvalidPuzzle, CodeTooLarge, CodeBodyTooLarge, CodeRequestTimeout, CodeNotFound,
		CodeMethodNotAllowed, CodeConflict, CodeIncomplete, CodeUnauthorized, CodeForbidden, CodeRateLimited,
		CodeQuotaExceeded, CodeIdempotencyKeyReused, CodeInProgress, CodeUnavailable, CodeInternal}
}

// TaskErrorCodes returns every code a TaskError may carry.
func TaskErrorCodes() []string {
	return []string{CodeInvalidPuzzle, CodeBudgetExceeded, CodeTimeout, CodeInternal, CodeCanceled, CodeExpired}
}
