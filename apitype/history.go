package apitype

import "time"

// History is the answer of GET /v1/history and of the operators' GET
// /history: what ended in each of the last minutes, oldest first, the
// current minute last.
type History struct {
	// Scope is HistoryScopeKey for the caller's own tasks, or
	// HistoryScopeAll for every key's (the operators' route, and /v1 when
	// API keys are off).
	Scope string `json:"scope"`
	// Minutes holds one point per minute, every minute of the span, with
	// zeros where nothing ended.
	Minutes []HistoryPoint `json:"minutes"`
}

// The scopes of a History.
const (
	HistoryScopeKey = "key"
	HistoryScopeAll = "all"
)

// HistoryPoint is one minute of history.
type HistoryPoint struct {
	// Time is the start of the minute, UTC.
	Time time.Time `json:"time"`
	// Completed and Failed count the tasks (single tasks and batch items)
	// that ended in the minute; canceled tasks are in neither.
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	// Singles counts the single tasks of Completed and Failed, whose
	// latency the percentiles describe.
	Singles int64 `json:"singles"`
	// P50Ms, P90Ms and P99Ms are latency percentiles of those single
	// tasks, from the API's acceptance to the end of the task, in
	// milliseconds: the upper bound of the histogram bucket the
	// percentile falls in (1, 2, 5, 10, 20, 50 ... 30000, 60000; a task
	// longer than a minute counts as 60000). Null when no single task
	// ended in the minute.
	P50Ms *float64 `json:"p50_ms"`
	P90Ms *float64 `json:"p90_ms"`
	P99Ms *float64 `json:"p99_ms"`
	// Pending counts the tasks that had not ended (pending or running)
	// at the minute's last sample; null when none was taken (no API
	// replica ran then).
	Pending *int64 `json:"pending"`
}
