package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/puzzle"
)

// Defaults of the global flags.
const (
	defaultServer    = "http://localhost:8080"
	defaultBatchSize = 10000 // the server's default MAX_BATCH_ITEMS
	defaultParallel  = 4
	// maxBatchBytes keeps a batch's body under the server's default
	// MAX_BATCH_BODY_BYTES (16 MiB) whatever the size of its items.
	maxBatchBytes = 12 << 20
)

// globals are the persistent flags of every remote command.
type globals struct {
	clients []*client.Client
	server  string
	apiKey  string
	timeout time.Duration
	retries int
	output  string
}

func (g *globals) bind(root *cobra.Command) {
	f := root.PersistentFlags()
	server := os.Getenv("PUZZLEQ_URL")
	if server == "" {
		server = defaultServer
	}
	f.StringVar(&g.server, "server", server, "API base URL (env PUZZLEQ_URL)")
	// The key's default is read in client(), not here: a default shows in
	// --help, and the key must not.
	f.StringVar(&g.apiKey, "api-key", "", "API key, sent as a bearer token (default $PUZZLEQ_API_KEY)")
	f.DurationVar(&g.timeout, "timeout", 30*time.Second, "timeout of each HTTP request, not counting a long poll's wait")
	f.IntVar(&g.retries, "retries", 6, "retries of a transient error (network, 5xx) before giving up; 429s are retried until the run ends")
	f.StringVarP(&g.output, "output", "o", "", "output format: json or table (default: table; submit results are JSON lines)")
}

func (g *globals) client() (*client.Client, error) {
	if !strings.HasPrefix(g.server, "http://") && !strings.HasPrefix(g.server, "https://") {
		return nil, usagef("--server must be an http:// or https:// URL, got %q", g.server)
	}
	if g.timeout <= 0 {
		return nil, usagef("--timeout must be positive, got %s", g.timeout)
	}
	key := g.apiKey
	if key == "" {
		key = os.Getenv("PUZZLEQ_API_KEY")
	}
	c := client.New(g.server, client.WithAPIKey(key), client.WithTimeout(g.timeout),
		client.WithRetries(g.retries), client.WithUserAgent("puzzlectl"))
	g.clients = append(g.clients, c)
	return c, nil
}

// close releases the clients' connections, so Run leaks nothing when
// called in-process (tests).
func (g *globals) close() {
	for _, c := range g.clients {
		c.CloseIdleConnections()
	}
}

// outputFormat returns the -o value, def when unset.
func (g *globals) outputFormat(def string) (string, error) {
	switch g.output {
	case "":
		return def, nil
	case "json", "table":
		return g.output, nil
	}
	return "", usagef("unknown output format %q: expected json or table", g.output)
}

// job is one request line of a run.
type job struct {
	line int    // 1-based line (or case) number in the input
	raw  []byte // the request's JSON
}

// batchRun is one batch of a run: a slice of the jobs, its body and its
// idempotency key, and once submitted the server's IDs.
type batchRun struct {
	index   int
	jobs    []job
	key     string
	body    []byte
	sub     *client.BatchSubmission
	results []client.Task // with wait: one per job, in order
	ended   int           // tasks seen ended, for progress
	err     error
	done    chan struct{} // closed when submitted (and, with wait, finished)
}

// runner submits jobs in batches with bounded concurrency and, with wait,
// reads their results back in input order.
type runner struct {
	c         *client.Client
	batchSize int
	parallel  int
	wait      bool
	stderr    io.Writer
	progress  *progress
	// runID salts the batches' idempotency keys: the same run ID, input
	// and batch size give the same keys, so a re-run resumes.
	runID string
	// resumable runs report the batches submitted when they fail too,
	// not only when interrupted.
	resumable bool
	// pollWait is the long poll of a batch's counts. Short while a bar is
	// drawn so its counts move; long otherwise.
	pollWait time.Duration
}

// splitBatches cuts jobs into batches of at most size items and
// maxBatchBytes of body, and derives each batch's idempotency key from its
// index and bytes: re-running the same input resubmits nothing that the
// server already accepted (the key replays the batch), and a retry after a
// lost response cannot double the work.
func splitBatches(jobs []job, size int, runID string) []*batchRun {
	var out []*batchRun
	for start := 0; start < len(jobs); {
		end, bytes := start, 0
		for end < len(jobs) && end-start < size && (end == start || bytes+len(jobs[end].raw)+1 <= maxBatchBytes) {
			bytes += len(jobs[end].raw) + 1
			end++
		}
		b := &batchRun{index: len(out), jobs: jobs[start:end], done: make(chan struct{})}
		raws := make([]json.RawMessage, len(b.jobs))
		for i, j := range b.jobs {
			raws[i] = j.raw
		}
		b.body = client.BatchBody(raws)
		h := sha256.New()
		fmt.Fprintf(h, "puzzlectl run %q batch %d\n", runID, b.index)
		h.Write(b.body)
		b.key = "puzzlectl-" + hex.EncodeToString(h.Sum(nil))[:40]
		out = append(out, b)
		start = end
	}
	return out
}

// stoppedError reports a run that stopped early (interrupted by its
// context, or failed), with what the user needs to resume it.
type stoppedError struct {
	interrupted        bool
	cause              error
	submitted, batches int
	tasks, total       int
	completed          int
	ids                []string
}

func (e *stoppedError) Error() string {
	var b strings.Builder
	if e.interrupted {
		fmt.Fprintf(&b, "interrupted (%v): ", e.cause)
	} else {
		fmt.Fprintf(&b, "%v\n", e.cause)
	}
	fmt.Fprintf(&b, "submitted %d of %d batches (%d of %d tasks)", e.submitted, e.batches, e.tasks, e.total)
	if e.completed > 0 {
		fmt.Fprintf(&b, ", %d results written", e.completed)
	}
	if len(e.ids) > 0 {
		b.WriteString("\nsubmitted batch IDs (see puzzlectl batch ID):")
		for _, id := range e.ids {
			b.WriteString("\n  " + id)
		}
	}
	b.WriteString("\nto resume, run the same command again (same input, --batch-size and --run-id):" +
		" batches the server already has are not submitted twice")
	return b.String()
}

func (e *stoppedError) Unwrap() error { return e.cause }

// run submits every job and calls emit for each batch in input order once
// it is submitted (and, with wait, finished). It stops at the first error.
func (r *runner) run(ctx context.Context, jobs []job, emit func(*batchRun) error) error {
	batches := splitBatches(jobs, r.batchSize, r.runID)
	inner, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Submitters: at most r.parallel batch POSTs at once.
	next := make(chan *batchRun)
	var wg sync.WaitGroup
	waitSem := make(chan struct{}, 2*r.parallel)
	var submittedN atomic.Int64
	for range min(r.parallel, len(batches)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				sub, err := r.c.SubmitBatchBody(inner, b.body, b.key)
				if err != nil {
					b.err = batchError(b, err)
					cancel(b.err)
					close(b.done)
					continue
				}
				if sub.Total != len(b.jobs) || len(sub.TaskIDs) != len(b.jobs) {
					b.err = fmt.Errorf("batch %d: the server accepted %d tasks of %d", b.index+1, sub.Total, len(b.jobs))
					cancel(b.err)
					close(b.done)
					continue
				}
				b.sub = sub
				submittedN.Add(1)
				r.progress.addSubmitted(len(b.jobs))
				if !r.wait {
					close(b.done)
					continue
				}
				// Waiting does not hold a submit slot, but is bounded too.
				select {
				case waitSem <- struct{}{}:
				case <-inner.Done():
					b.err = context.Cause(inner)
					close(b.done)
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-waitSem }()
					b.err = r.await(inner, b)
					if b.err != nil {
						cancel(b.err)
					}
					close(b.done)
				}()
			}
		}()
	}
	go func() {
		defer close(next)
		for _, b := range batches {
			select {
			case next <- b:
			case <-inner.Done():
				return
			}
		}
	}()

	var runErr error
	emitted := 0
	for _, b := range batches {
		select {
		case <-b.done:
		case <-inner.Done():
		}
		if inner.Err() != nil {
			break
		}
		if b.err != nil {
			runErr = b.err
			break
		}
		if err := emit(b); err != nil {
			runErr = err
			cancel(err)
			break
		}
		emitted += len(b.jobs)
		b.results, b.body = nil, nil
	}
	if runErr == nil && inner.Err() != nil {
		runErr = context.Cause(inner)
	}
	cancel(runErr)
	wg.Wait()
	r.progress.finish()
	if runErr == nil {
		return nil
	}
	if !r.resumable {
		return runErr
	}
	interrupted := ctx.Err() != nil
	se := &stoppedError{interrupted: interrupted, cause: runErr, batches: len(batches), total: len(jobs)}
	if interrupted {
		se.cause = context.Cause(ctx)
	}
	if r.wait {
		se.completed = emitted
	}
	for _, b := range batches {
		if b.sub != nil {
			se.submitted++
			se.tasks += len(b.jobs)
			se.ids = append(se.ids, b.sub.ID)
		}
	}
	if !interrupted && se.submitted == 0 {
		return runErr
	}
	return se
}

// batchError names the batch and its lines in a submission error, and
// suggests smaller batches when the server timed out or ran out of room.
func batchError(b *batchRun, err error) error {
	if inputErr := (*client.Error)(nil); errors.As(err, &inputErr) && inputErr.StatusCode < 500 && inputErr.StatusCode != 429 {
		return fmt.Errorf("batch %d (lines %d-%d): %w", b.index+1, b.jobs[0].line, b.jobs[len(b.jobs)-1].line, err)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("batch %d (lines %d-%d): %w (a smaller --batch-size lightens each request)",
		b.index+1, b.jobs[0].line, b.jobs[len(b.jobs)-1].line, err)
}

// await long-polls a batch until every task has ended, then reads the
// results in order.
func (r *runner) await(ctx context.Context, b *batchRun) error {
	for {
		bt, err := r.c.GetBatch(ctx, b.sub.ID, "", 1, r.pollWait)
		if err != nil {
			return fmt.Errorf("batch %s: %w", b.sub.ID, err)
		}
		ended := bt.Counts.Ended()
		r.progress.addCompleted(ended - b.ended)
		b.ended = ended
		if bt.Done {
			break
		}
	}
	res, err := r.results(ctx, b)
	if err != nil {
		return fmt.Errorf("batch %s: %w", b.sub.ID, err)
	}
	b.results = res
	return nil
}

// results reads a finished batch's tasks in order: its output in one
// request when every task completed (the common case), else page by page.
func (r *runner) results(ctx context.Context, b *batchRun) ([]client.Task, error) {
	n := len(b.jobs)
	out, err := r.c.BatchOutput(ctx, b.sub.ID, 0)
	if err == nil {
		tasks := make([]client.Task, 0, n)
		for len(out) > 0 && len(tasks) < n {
			line, rest, _ := bytes.Cut(out, []byte{'\n'})
			tasks = append(tasks, client.Task{ID: b.sub.TaskIDs[len(tasks)], State: client.StateCompleted, Result: line})
			out = rest
		}
		if len(tasks) == n && len(out) == 0 {
			return tasks, nil
		}
		// An unexpected shape: fall back to the task resources.
	} else {
		var ae *client.Error
		if !errors.As(err, &ae) || ae.StatusCode != 409 {
			return nil, err
		}
	}
	tasks := make([]client.Task, 0, n)
	cursor := ""
	for {
		page, err := r.c.GetBatch(ctx, b.sub.ID, cursor, 1000, 0)
		if err != nil {
			return nil, err
		}
		tasks = append(tasks, page.Tasks...)
		if page.NextCursor == nil || len(page.Tasks) == 0 {
			break
		}
		cursor = *page.NextCursor
	}
	if len(tasks) != n {
		return nil, fmt.Errorf("read %d results, expected %d", len(tasks), n)
	}
	return tasks, nil
}

// remoteSolver solves through the API: one run of batches, results in
// order, so solve prints what --local prints.
type remoteSolver struct {
	g      *globals
	stderr io.Writer
}

func (s remoteSolver) solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed) ([]json.RawMessage, error) {
	c, err := s.g.client()
	if err != nil {
		return nil, err
	}
	jobs := make([]job, len(reqs))
	for i, p := range reqs {
		jobs[i] = job{line: i + 1, raw: p.Payload()}
	}
	// A fresh run ID: retries within this run are deduplicated, but
	// solving the same input again solves it again (a task that failed,
	// say on a deadline, is not replayed).
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	r := &runner{c: c, batchSize: defaultBatchSize, parallel: defaultParallel, wait: true, stderr: s.stderr,
		pollWait: 30 * time.Second, runID: hex.EncodeToString(nonce[:])}
	if r.progress = newProgress(s.stderr, len(jobs), true); r.progress != nil {
		r.pollWait = time.Second
	}
	out := make([]json.RawMessage, 0, len(reqs))
	err = r.run(cmd.Context(), jobs, func(b *batchRun) error {
		for i, t := range b.results {
			if t.State != client.StateCompleted {
				return fmt.Errorf("case %d: %s", b.jobs[i].line, taskFailure(&t))
			}
			out = append(out, t.Result)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// taskFailure describes a task that did not complete.
func taskFailure(t *client.Task) string {
	if t.Error != nil {
		return fmt.Sprintf("task %s %s: %s: %s", t.ID, t.State, t.Error.Code, t.Error.Message)
	}
	return fmt.Sprintf("task %s %s", t.ID, t.State)
}

// taskFailedError marks a run in which some task failed: exit status 1.
type taskFailedError struct{ failed, total int }

func (e *taskFailedError) Error() string {
	return strconv.Itoa(e.failed) + " of " + strconv.Itoa(e.total) + " tasks did not complete"
}
