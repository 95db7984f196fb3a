package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// Bounds on every request loop.
const (
	requestTimeout = 90 * time.Second // one HTTP exchange, long polls included
	taskWait       = "30s"            // ?wait= of a task long poll
	maxTaskPolls   = 4                // long polls per task before giving up
	batchWait      = "60s"
	maxBatchPolls  = 3
)

func newHTTP(clients int) *http.Client {
	return &http.Client{
		Timeout: requestTimeout,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConns:        clients + 16,
			MaxIdleConnsPerHost: clients + 16,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
		// The API never redirects; refuse to follow one anywhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends one request and decodes a 2xx JSON answer into out.
func (lg *loadgen) do(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	return lg.doAt(ctx, lg.base, method, path, body, out)
}

// doAt is do against the server at base.
func (lg *loadgen) doAt(ctx context.Context, base, method, path string, body []byte, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := lg.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b[:min(len(b), 300)]))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// solveOne submits body and long-polls until the task ends. It returns
// whether the API accepted the task, its final state and the time from
// submission to result.
func (lg *loadgen) solveOne(ctx context.Context, body []byte) (submitted bool, state apitype.TaskState, latency time.Duration, err error) {
	return lg.solveAt(ctx, lg.base, body)
}

// solveAt is solveOne against the server at base.
func (lg *loadgen) solveAt(ctx context.Context, base string, body []byte) (submitted bool, state apitype.TaskState, latency time.Duration, err error) {
	t0 := time.Now()
	var t apitype.Task
	path := "/v1/tasks"
	if lg.o.submitWait {
		path += "?wait=" + taskWait
	}
	if _, err := lg.doAt(ctx, base, http.MethodPost, path, body, &t); err != nil {
		return false, "", 0, err
	}
	for i := 0; !t.Terminal() && i < maxTaskPolls; i++ {
		if _, err := lg.doAt(ctx, base, http.MethodGet, "/v1/tasks/"+t.ID+"?wait="+taskWait, nil, &t); err != nil {
			return true, "", 0, err
		}
	}
	if !t.Terminal() {
		return true, t.State, 0, fmt.Errorf("task %s still %s after %d long polls", t.ID, t.State, maxTaskPolls)
	}
	return true, t.State, time.Since(t0), nil
}

// ready waits up to 10s for /readyz.
func (lg *loadgen) ready(ctx context.Context) error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err = lg.do(ctx, http.MethodGet, "/readyz", nil, nil); err == nil {
			return nil
		}
	}
	return fmt.Errorf("the API at %s is not ready: %w", lg.base, err)
}
