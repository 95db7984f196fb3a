package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// The list, retry and status resources, under the client's names.
type (
	// BatchSummary is a batch of a list: its counts and state, without
	// its tasks.
	BatchSummary = apitype.BatchSummary
	// BatchList is a page of batches, newest first.
	BatchList = apitype.BatchList
	// TaskList is a page of tasks.
	TaskList = apitype.TaskList
	// ServiceStatus is what GET /v1/status says of the workers and queues.
	ServiceStatus = apitype.ServiceStatus
	// History is what ended in each of the last minutes (GET /v1/history).
	History = apitype.History
	// HistoryPoint is one minute of a History.
	HistoryPoint = apitype.HistoryPoint
)

// ListOptions narrow a list of batches or tasks and say which page to
// read. The zero value reads the first page of everything.
type ListOptions struct {
	// State keeps only those in this state; for a batch, its listed
	// state (apitype.BatchStateOf).
	State TaskState
	// Kind keeps only tasks of this kind, or batches with an item of it.
	Kind string
	// CreatedAfter keeps only those created after it.
	CreatedAfter time.Time
	// CustomID keeps only the batch items submitted with exactly this
	// custom_id (at most 64 bytes); it applies to BatchItems only, and
	// makes the server read the batch's custom_id lists once.
	CustomID string
	// Cursor is the NextCursor of the previous page; "" for the first.
	Cursor string
	// Limit is the most per page (0: the server's default, 100; at most
	// 1000).
	Limit int
}

func (o ListOptions) query() url.Values {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", string(o.State))
	}
	if o.Kind != "" {
		q.Set("kind", o.Kind)
	}
	if !o.CreatedAfter.IsZero() {
		q.Set("created_after", o.CreatedAfter.UTC().Format(time.RFC3339Nano))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	return q
}

// ListBatches reads a page of the caller's batches, newest first. A
// filtered page may be short, or empty, while NextCursor is set: only a
// nil NextCursor ends the list.
func (c *Client) ListBatches(ctx context.Context, o ListOptions) (*BatchList, error) {
	var l BatchList
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/batches", query: o.query(), retry: retryAlways}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// ListTasks reads a page of the caller's single tasks, newest first (a
// batch's items are read with BatchItems), as ListBatches pages.
func (c *Client) ListTasks(ctx context.Context, o ListOptions) (*TaskList, error) {
	var l TaskList
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/tasks", query: o.query(), retry: retryAlways}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// BatchItems reads a page of a batch's tasks in submission order, those
// in state only when it is set (StateFailed lists what failed, with its
// error), and those whose custom_id is o.CustomID only when it is set
// (usually one). Only o.State, o.CustomID, o.Cursor and o.Limit apply.
func (c *Client) BatchItems(ctx context.Context, batchID string, o ListOptions) (*TaskList, error) {
	q := ListOptions{State: o.State, Cursor: o.Cursor, Limit: o.Limit}.query()
	if o.CustomID != "" {
		q.Set("custom_id", o.CustomID)
	}
	var l TaskList
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/batches/" + url.PathEscape(batchID) + "/items", query: q, retry: retryAlways}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// RetryBatch queues a batch's failed and canceled tasks again, with their
// IDs and custom_ids, and returns how many (while the batch runs, a task
// whose chunk still runs waits for a later retry). A retry the server cut
// short (Complete false: it re-opened some tasks, then could not reach
// the rest) is sent again, a second apart, up to retryRounds times in all;
// the count is the sum. Sending it again is safe: a task is never
// re-opened twice.
func (c *Client) RetryBatch(ctx context.Context, batchID string) (int, error) {
	total := 0
	for round := 1; ; round++ {
		var r apitype.BatchRetried
		_, err := c.do(ctx, call{method: http.MethodPost, path: "/v1/batches/" + url.PathEscape(batchID) + "/retry", retry: retryIfNotAccepted}, &r)
		total += r.Retried
		if err != nil || r.Complete {
			return total, err
		}
		if round == retryRounds {
			return total, fmt.Errorf("puzzleq: retry of batch %s re-opened %d tasks but was cut short %d times; retry again", batchID, total, round)
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// retryRounds bounds how often RetryBatch sends a retry that the server
// cut short.
const retryRounds = 5

// Status reads GET /v1/status: the live workers, their slots, the queues'
// depths and the age of the oldest waiting work. WorkersAlive 0 means
// nothing runs.
func (c *Client) Status(ctx context.Context) (*ServiceStatus, error) {
	var s ServiceStatus
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/status", retry: retryAlways}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// History reads GET /v1/history: one point per minute of the last
// minutes (1 to 1440; 0 means the server's default, 60), the current
// minute last, with the key's tasks that completed and failed, its single
// tasks' latency percentiles and its tasks not ended.
func (c *Client) History(ctx context.Context, minutes int) (*History, error) {
	var q url.Values
	if minutes != 0 {
		q = url.Values{"minutes": {strconv.Itoa(minutes)}}
	}
	var h History
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/history", query: q, retry: retryAlways}, &h); err != nil {
		return nil, err
	}
	return &h, nil
}
