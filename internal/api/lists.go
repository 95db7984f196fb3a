package api

// The list routes (GET /v1/batches, GET /v1/tasks,
// GET /v1/batches/{id}/items), the retry of a batch's failed items
// (POST /v1/batches/{id}/retry), the service's status (GET /v1/status)
// and the check that every route is sent only the query parameters it
// takes.

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// ListStore is what the list, retry and status routes need of the store;
// *store.Store satisfies it.
type ListStore interface {
	// ListBatches returns a page of owner's batches, newest first.
	ListBatches(ctx context.Context, owner string, f store.ListFilter, cursor string, limit int) ([]*store.Batch, *string, error)
	// ListTasks returns a page of owner's single tasks, newest first.
	ListTasks(ctx context.Context, owner string, f store.ListFilter, cursor string, limit int) ([]*store.Task, *string, error)
	// ItemsAt returns the items of b at the given indexes.
	ItemsAt(ctx context.Context, b *store.Batch, idx []int) ([]*store.Task, error)
	// RetryBatch re-opens a done batch's failed and canceled items.
	RetryBatch(ctx context.Context, b *store.Batch, quota int, timeout store.RetryTimeout) (int, error)
	// RetryItem re-opens one failed or canceled item of a batch.
	RetryItem(ctx context.Context, b *store.Batch, index, quota int, timeout store.RetryTimeout) (bool, error)
	// Backlog reports the units waiting in the feed and the creation
	// time of the oldest batch they belong to.
	Backlog(ctx context.Context) (units int, oldest time.Time, err error)
	// Parking reports the expensive runs waiting for a solver slot, which
	// asynq holds in its retry sets, and the retry sets' sizes of queues.
	Parking(ctx context.Context, queues ...string) (store.Parking, error)
	// Presences returns the live workers as their last heartbeat
	// described them.
	Presences(ctx context.Context) ([]worker.Presence, error)
}

// Presence reports the queues' depths; *asynq.Inspector satisfies it.
type Presence interface {
	// Queues names the queues that exist: GetQueueInfo fails for one
	// on which nothing was ever enqueued.
	Queues() ([]string, error)
	GetQueueInfo(queue string) (*asynq.QueueInfo, error)
}

// queryParams are the query parameters each route takes (by its gin
// path). Any other is refused with 400 naming it, as an unknown JSON
// field is: a misspelt "state" would otherwise silently list everything.
// A route that is not here (the mounted dashboards, /metrics) is not
// checked.
var queryParams = map[string][]string{
	"GET /healthz":                nil,
	"GET /readyz":                 nil,
	"GET /openapi.yaml":           nil,
	"GET /v1/status":              nil,
	"GET /v1/history":             {"minutes"},
	"GET /history":                {"minutes"},
	"GET /v1/tasks":               listParams,
	"POST /v1/tasks":              {"wait", "webhook"},
	"GET /v1/tasks/:id":           {"wait"},
	"GET /v1/tasks/:id/puzzle":    nil,
	"DELETE /v1/tasks/:id":        {"purge"},
	"POST /v1/tasks/:id/retry":    nil,
	"GET /v1/batches":             listParams,
	"POST /v1/batches":            {"format", "webhook"},
	"GET /v1/batches/:id":         {"wait", "cursor", "limit"},
	"DELETE /v1/batches/:id":      {"purge"},
	"GET /v1/batches/:id/output":  {"wait"},
	"GET /v1/batches/:id/results": resultsParams,
	"GET /v1/batches/:id/items":   {"state", "custom_id", "cursor", "limit"},
	"GET /v1/batches/:id/events":  {"from"},
	"POST /v1/batches/:id/retry":  nil,
}

// listParams are the query parameters of the owner's lists.
var listParams = []string{"state", "kind", "created_after", "cursor", "limit"}

// strictQuery answers 400 to a request with a query parameter its route
// does not take (see queryParams).
func strictQuery() gin.HandlerFunc {
	return func(c *gin.Context) {
		allowed, ok := queryParams[c.Request.Method+" "+c.FullPath()]
		if ok && c.Request.URL.RawQuery != "" {
			if err := onlyParams(c, allowed); err != nil {
				fail(c, err)
				return
			}
		}
		c.Next()
	}
}

// listFilter reads the filters of a list's query.
func listFilter(c *gin.Context) (store.ListFilter, error) {
	var f store.ListFilter
	if v, ok := c.GetQuery("state"); ok {
		st, err := parseState(v)
		if err != nil {
			return f, err
		}
		f.State = st
	}
	if v, ok := c.GetQuery("kind"); ok {
		if _, err := puzzle.SpecOf(puzzle.Kind(v)); err != nil {
			return f, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "kind",
				"kind must be one of sliding, sweep, fill; got %q", truncate(v, 20))
		}
		f.Kind = v
	}
	if v, ok := c.GetQuery("created_after"); ok {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "created_after",
				"created_after must be an RFC 3339 time such as 2026-11-30T09:00:00Z; got %q", truncate(v, 40))
		}
		f.CreatedAfter = t
	}
	return f, nil
}

// parseState reads a task state of a query's state parameter.
func parseState(v string) (apitype.TaskState, error) {
	st := apitype.TaskState(v)
	if !slices.Contains(apitype.TaskStates(), st) {
		return "", newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "state",
			"state must be one of pending, active, completed, failed, canceled; got %q", truncate(v, 20))
	}
	return st, nil
}

// listLimit reads ?limit=, 1 to maxPageLimit, defaultPageLimit when
// absent.
func listLimit(c *gin.Context) (int, error) {
	v, ok := c.GetQuery("limit")
	if !ok {
		return defaultPageLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPageLimit {
		return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "limit", "limit must be between 1 and %d", maxPageLimit)
	}
	return n, nil
}

// errBadCursor is the answer to a cursor this server did not hand out.
var errBadCursor = newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "cursor", "cursor must be a value returned as next_cursor")

// listQuery reads a list's filter, cursor and limit.
func listQuery(c *gin.Context) (store.ListFilter, string, int, error) {
	f, err := listFilter(c)
	if err != nil {
		return f, "", 0, err
	}
	limit, err := listLimit(c)
	if err != nil {
		return f, "", 0, err
	}
	return f, c.Query("cursor"), limit, nil
}

func listError(err error) error {
	if errors.Is(err, store.ErrBadCursor) {
		return errBadCursor
	}
	return err
}

// summary renders a batch record as a list's entry.
func summary(b *store.Batch) apitype.BatchSummary {
	r := apitype.BatchSummary{ID: b.ID, State: store.BatchState(b), Total: b.Total, Counts: counts(b), Done: b.Done(),
		Kinds: b.Kinds, CreatedAt: timePtr(b.CreatedAt), DoneAt: timePtr(b.DoneAt)}
	if r.Kinds == nil {
		r.Kinds = []string{}
	}
	if b.Format != "" {
		f := b.Format
		r.Format = &f
	}
	return r
}

func counts(b *store.Batch) apitype.Counts {
	return apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
		Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
		Canceled: b.Counts[apitype.TaskStateCanceled]}
}

// queues are the queues GET /v1/status reports: the solvers' and the
// cheap lane's.
var queues = append(append([]string{}, tasks.Queues...), tasks.CheapQueues...)

// status answers GET /v1/status: the live workers (their own heartbeats,
// every HEARTBEAT_INTERVAL), their slots, the queues' depths and the
// oldest waiting work, the feed's included.
func (s *Server) status(c *gin.Context) {
	if s.opts.Presence == nil {
		fail(c, errors.New("no presence source is wired"))
		return
	}
	out := apitype.ServiceStatus{Workers: []apitype.WorkerStatus{}, Queues: []apitype.QueueStatus{}}
	// Read from the workers' own heartbeats, not asynq's server
	// heartbeats, which are 5 s apart: the busy count and the queues'
	// depths below are then of the same moment, within a beat.
	presences, err := s.store.Presences(c.Request.Context())
	if err != nil {
		fail(c, err)
		return
	}
	for _, p := range presences {
		w := apitype.WorkerStatus{ID: p.ID, Slots: p.Slots, Busy: p.Busy(),
			StartedAt: timePtr(time.UnixMilli(p.Started).UTC()), Running: map[string]int{}, Draining: p.Draining}
		maps.Copy(w.Running, p.Running)
		out.Workers = append(out.Workers, w)
		if w.Draining {
			continue // it takes nothing new: the totals are of those that do
		}
		out.WorkersAlive++
		out.Slots += w.Slots
		out.Busy += w.Busy
	}
	exist, err := s.opts.Presence.Queues()
	if err != nil {
		fail(c, err)
		return
	}
	infos := map[string]*asynq.QueueInfo{}
	for _, q := range queues {
		if slices.Contains(exist, q) {
			info, err := s.opts.Presence.GetQueueInfo(q)
			if err != nil {
				fail(c, err)
				return
			}
			infos[q] = info
		}
	}
	parking, err := s.store.Parking(c.Request.Context(), queues...)
	if err != nil {
		fail(c, err)
		return
	}
	for _, q := range queues {
		qs := apitype.QueueStatus{Name: q}
		if info := infos[q]; info != nil {
			// asynq's retry set holds both the runs parked for a solver
			// slot and the tasks retried after an error; the parked ones
			// are told apart (store.Parking) and the rest are retries.
			// Parking reads the set's size with them in one transaction
			// (its Retry), not with asynq's count, which is read earlier:
			// parked runs come and go from the set every second or two
			// (promoted, back by their retry delay, parked again), and
			// ones that left between the two reads would count as
			// retries. A queue with no parked run has asynq's count. The
			// min and max only guard the sums: waiting plus retry is the
			// set's size, neither below 0.
			qs.Pending, qs.Active, qs.Retry = info.Pending, info.Active, info.Retry
			if n, ok := parking.Retry[q]; ok {
				qs.Waiting = min(parking.ByQueue[q], n)
				qs.Retry = max(n-qs.Waiting, 0)
			}
			if info.Pending > 0 {
				qs.OldestPendingSeconds = info.Latency.Seconds()
			}
			if qs.Waiting > 0 {
				qs.OldestPendingSeconds = max(qs.OldestPendingSeconds, parking.Oldest[q].Seconds())
			}
		}
		out.Queues = append(out.Queues, qs)
		out.OldestPendingSeconds = max(out.OldestPendingSeconds, qs.OldestPendingSeconds)
	}
	units, oldest, err := s.store.Backlog(c.Request.Context())
	if err != nil {
		fail(c, err)
		return
	}
	out.BacklogUnits = units
	if units > 0 && !oldest.IsZero() {
		out.OldestPendingSeconds = max(out.OldestPendingSeconds, time.Since(oldest).Seconds())
	}
	c.JSON(http.StatusOK, out)
}
