package cli

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/puzzle"
)

// Defaults of the global flags.
const (
	defaultServer    = "http://localhost:8080"
	defaultBatchSize = 1000000 // the server's default MAX_BATCH_ITEMS
	defaultParallel  = 4
	// maxBatchBytes is the server's default MAX_BATCH_BODY_BYTES: an
	// input within both defaults is one batch, one request.
	maxBatchBytes = 256 << 20
)

// globals are the persistent flags of every remote command.
type globals struct {
	clients []*client.Client
	flags   *pflag.FlagSet
	server  string
	apiKey  string
	context string
	timeout time.Duration
	retries int
	output  string
	// resolved is set once resolve has filled server and apiKey.
	resolved bool
}

func (g *globals) bind(root *cobra.Command) {
	f := root.PersistentFlags()
	g.flags = f
	// The defaults are filled by resolve, not here: a default shows in
	// --help, and a key must not.
	f.StringVar(&g.server, "server", "", "API base URL (default $PUZZLEQ_URL, else the context's server, else "+defaultServer+")")
	f.StringVar(&g.apiKey, "api-key", "", "API key, sent as a bearer token (default $PUZZLEQ_API_KEY, else the context's key)")
	f.StringVar(&g.context, "context", "", "the config file's context to use (default its current context); see puzzlectl config")
	f.DurationVar(&g.timeout, "timeout", 30*time.Second, "timeout of each HTTP request, not counting a long poll's wait; set with --wait or --watch, it bounds the whole wait")
	f.IntVar(&g.retries, "retries", 6, "retries of a transient error (network, 5xx) before giving up; 429s are retried until the run ends")
	f.StringVarP(&g.output, "output", "o", "", "output format: table, json (one document; a list is one array), yaml, or ndjson (one object per line) (default: table; ndjson for submit and results)")
}

func (g *globals) client() (*client.Client, error) {
	if err := g.resolve(); err != nil {
		return nil, err
	}
	if err := checkServer(g.server); err != nil {
		return nil, err
	}
	if g.timeout <= 0 {
		return nil, usagef("--timeout must be positive, got %s", g.timeout)
	}
	opts := []client.Option{client.WithAPIKey(g.apiKey), client.WithTimeout(g.timeout),
		client.WithRetries(g.retries), client.WithUserAgent("puzzlectl")}
	if isLoopback(g.server) {
		// Compressing a results stream costs the API and puzzlectl more
		// CPU than the bytes it saves cost on loopback.
		opts = append(opts, client.WithoutResultsGzip())
	}
	c := client.New(g.server, opts...)
	g.clients = append(g.clients, c)
	return c, nil
}

// checkServer refuses a server that is not an http(s) URL.
func checkServer(server string) error {
	if !strings.HasPrefix(server, "http://") && !strings.HasPrefix(server, "https://") {
		return usagef("--server must be an http:// or https:// URL, got %q", server)
	}
	return nil
}

// isLoopback reports whether the URL's host is this machine: localhost or
// a loopback address.
func isLoopback(server string) bool {
	u, err := url.Parse(server)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsLoopback()
}

// close releases the clients' connections, so Run leaks nothing when
// called in-process (tests).
func (g *globals) close() {
	for _, c := range g.clients {
		c.CloseIdleConnections()
	}
}

// remote is the output format (outputFormat) and the API client (client)
// of a command that talks to the API.
func (g *globals) remote(def string) (string, *client.Client, error) {
	format, err := g.outputFormat(def)
	if err != nil {
		return "", nil, err
	}
	c, err := g.client()
	return format, c, err
}

// outputFormat returns the -o value, def when unset.
func (g *globals) outputFormat(def string) (string, error) {
	switch g.output {
	case "":
		return def, nil
	case formatTable, formatJSON, formatYAML, formatNDJSON:
		return g.output, nil
	}
	return "", usagef("unknown output format -o %q: expected table, json, yaml or ndjson", g.output)
}

// item is one request line of a run.
type item struct {
	line int    // 1-based line (or case) number in the input
	raw  []byte // the request's JSON, as sent (custom_id included)
	// customID is the line's custom_id, when hasCustomID.
	customID    string
	hasCustomID bool
}

// batchRun is one batch of a run: a slice of the items, its NDJSON body
// (read from the items, never copied) and its idempotency key, and once
// submitted the server's answer.
type batchRun struct {
	index     int
	items     []item
	key       string
	body      client.Body
	sub       *client.BatchSubmission
	err       error
	submitted chan struct{} // closed when sub or err is set
	ended     int           // items seen ended, for progress; under runner.mu
	finished  atomic.Bool   // every result was read
}

// output receives a run's results in input order: batch for each batch
// once submitted (without wait), item for each item once ended (with
// wait).
type output struct {
	batch func(b *batchRun) error
	item  func(j *item, l *client.ResultLine) error
}

// runner submits items in batches with bounded concurrency and, with wait,
// streams their results back in input order.
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
	// resultsWait is the ?wait of each request of a batch's results.
	resultsWait time.Duration
	// countsEvery is how often a drawn bar reads the batches' counts.
	countsEvery time.Duration
	// gate, when set, is the validation of items still under way: the
	// upload streams each line as it passes, and a failure of it is the
	// run's error (see validation).
	gate *validation
	// announce, when set, is called with each batch once it is
	// accepted, from the goroutine that submitted it.
	announce func(b *batchRun)
	// webhook, when set, is every batch's completion webhook
	// (--webhook).
	webhook string

	mu sync.Mutex // guards batchRun.ended
}

// minResultsPoll is the least time between two requests of a batch's
// results that brought nothing new, in case a server does not hold them.
const minResultsPoll = 500 * time.Millisecond

// linesReader reads items as NDJSON: each raw request and a newline. With
// a gate, each line goes only once the gate released it, and the body's
// last byte only once the gate's validation passed as a whole.
type linesReader struct {
	items []item
	i     int // the item being read
	off   int // bytes of it read; len(raw) means its newline is next
	gate  *validation
	first int // the index of items[0] in the gate's items
}

func (r *linesReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.i < len(r.items) {
		raw := r.items[r.i].raw
		if r.gate != nil && r.off == 0 {
			if idx := int64(r.first + r.i); idx >= r.gate.released.Load() {
				if n > 0 {
					return n, nil // send what passed while the rest is checked
				}
				if err := r.gate.waitLine(int(idx)); err != nil {
					return 0, err
				}
			}
		}
		if r.off < len(raw) {
			c := copy(p[n:], raw[r.off:])
			n += c
			r.off += c
			continue
		}
		if r.gate != nil && r.i == len(r.items)-1 {
			if n > 0 {
				return n, nil
			}
			if err := r.gate.final(); err != nil {
				return 0, err
			}
		}
		p[n] = '\n'
		n++
		r.i, r.off = r.i+1, 0
	}
	if n == 0 && r.i >= len(r.items) {
		return 0, io.EOF
	}
	return n, nil
}

// splitBatches cuts items into batches of at most size items and
// maxBatchBytes of body, and derives each batch's idempotency key from its
// index and bytes: re-running the same input resubmits nothing that the
// server already accepted (the key replays the batch), and a retry after a
// lost response cannot double the work. Bodies are read from the items when
// sent, so the input is held once.
func splitBatches(items []item, size int, runID string, gate *validation) []*batchRun {
	var out []*batchRun
	for start := 0; start < len(items); {
		end, bytes := start, 0
		for end < len(items) && end-start < size && (end == start || bytes+len(items[end].raw)+1 <= maxBatchBytes) {
			bytes += len(items[end].raw) + 1
			end++
		}
		b := &batchRun{index: len(out), items: items[start:end], submitted: make(chan struct{})}
		first := start
		b.body = client.FuncBody(int64(bytes), func() (io.Reader, error) {
			return &linesReader{items: b.items, gate: gate, first: first}, nil
		})
		h := sha256.New()
		fmt.Fprintf(h, "puzzlectl run %q batch %d\n", runID, b.index)
		_, _ = io.Copy(h, &linesReader{items: b.items})
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

// run submits every item and hands out what comes back, in input order:
// each batch once submitted, or with wait each item's result, streamed.
// It stops at the first error.
func (r *runner) run(ctx context.Context, items []item, out output) error {
	batches := splitBatches(items, r.batchSize, r.runID, r.gate)
	if r.gate != nil && len(batches) > 1 {
		// Batches are accepted one by one, so none may be sent before
		// every line passed; and an early batch must not hold its upload
		// open, its last byte waiting, while a large input is checked.
		if err := r.gate.wait(); err != nil {
			return err
		}
	}
	inner, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Submitters: at most r.parallel batch POSTs at once. Results are
	// read by the loop below, one batch at a time in order, while the
	// server solves the later ones.
	next := make(chan *batchRun)
	var wg sync.WaitGroup
	for range min(r.parallel, len(batches)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				b.sub, b.err = r.submit(inner, b)
				if b.err != nil {
					cancel(b.err)
				} else {
					r.progress.addSubmitted(len(b.items))
					if b.sub.Replayed && r.wait && r.progress != nil {
						// A resumed run: what this batch already did
						// is not this run's pace.
						r.noteBaseline(inner, b)
					}
					if r.announce != nil {
						r.announce(b)
					}
				}
				close(b.submitted)
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
	if r.wait && r.progress != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.pollCounts(inner, batches) }()
	}

	var runErr error
	emitted := 0
	for _, b := range batches {
		select {
		case <-b.submitted:
		case <-inner.Done():
		}
		if inner.Err() != nil {
			break
		}
		if b.err != nil {
			runErr = b.err
			break
		}
		var err error
		if r.wait {
			err = r.stream(inner, b, func(j *item, l *client.ResultLine) error {
				if err := out.item(j, l); err != nil {
					return err
				}
				emitted++
				return nil
			})
		} else {
			err = out.batch(b)
		}
		if err != nil {
			if inner.Err() == nil {
				runErr = err
				cancel(err)
			}
			break
		}
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
	if r.gate != nil && ctx.Err() == nil {
		// A bad line (or --out) that cut the upload short is what to
		// report, before whatever the server or the transport made of
		// the cut (or of a later line, which it may have answered first).
		_ = r.gate.wait()
		if err := r.gate.failure(); err != nil {
			return err
		}
	}
	if !r.resumable {
		return runErr
	}
	interrupted := ctx.Err() != nil
	se := &stoppedError{interrupted: interrupted, cause: runErr, batches: len(batches), total: len(items)}
	if interrupted {
		se.cause = context.Cause(ctx)
	}
	if r.wait {
		se.completed = emitted
	}
	for _, b := range batches {
		select {
		case <-b.submitted:
		default:
			continue
		}
		if b.sub != nil {
			se.submitted++
			se.tasks += len(b.items)
			se.ids = append(se.ids, b.sub.ID)
		}
	}
	if !interrupted && se.submitted == 0 {
		return runErr
	}
	return se
}

// submit posts one batch as NDJSON under its idempotency key.
func (r *runner) submit(ctx context.Context, b *batchRun) (*client.BatchSubmission, error) {
	sub, err := r.c.SubmitBatch(ctx, client.NDJSONBatch(b.body), client.WithIdempotencyKey(b.key), client.WithWebhook(r.webhook))
	if err != nil {
		return nil, batchError(b, err, r.resumable)
	}
	if sub.Total != len(b.items) || (sub.TaskIDs != nil && len(sub.TaskIDs) != len(b.items)) {
		return nil, fmt.Errorf("batch %d: the server accepted %d tasks of %d", b.index+1, sub.Total, len(b.items))
	}
	return sub, nil
}

// bodyLine matches the line number the server names in a rejected body.
var bodyLine = regexp.MustCompile(`^line (\d+): `)

// batchError names the batch and its lines in a submission error, and,
// for a command with a --batch-size flag (sizeFlag: submit's resumable
// runs), suggests smaller batches when the server timed out or ran out of
// room.
// A line the server names is a line of the batch's body, which skips the
// input's blank lines and starts at the batch's first: it is translated
// to the input's line.
func batchError(b *batchRun, err error, sizeFlag bool) error {
	lines := fmt.Sprintf("lines %d-%d", b.items[0].line, b.items[len(b.items)-1].line)
	var ae *client.Error
	if errors.As(err, &ae) && ae.StatusCode < 500 && ae.StatusCode != 429 {
		if m := bodyLine.FindStringSubmatch(ae.Message); m != nil {
			if n, _ := strconv.Atoi(m[1]); n >= 1 && n <= len(b.items) {
				lines = fmt.Sprintf("input line %d", b.items[n-1].line)
			}
		}
		if ae.StatusCode == 413 && sizeFlag {
			return fmt.Errorf("batch %d (%s): %w (a smaller --batch-size keeps each batch under the server's limits)", b.index+1, lines, err)
		}
		return fmt.Errorf("batch %d (%s): %w", b.index+1, lines, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if !sizeFlag {
		return fmt.Errorf("batch %d (%s): %w", b.index+1, lines, err)
	}
	return fmt.Errorf("batch %d (%s): %w (a smaller --batch-size lightens each request)", b.index+1, lines, err)
}

// stream reads a batch's results in order and hands each ended item to
// item as it arrives, while the batch runs. Each request starts at the
// first item not yet written (from=) and is read up to the first item
// that has not ended; then, when that request brought nothing new, it
// long-polls that item (GET /v1/tasks/{item}?wait=, woken when items of
// its chunk end) before asking again. So results are written as soon as
// every item before them has ended, each line is read once, and the
// download overlaps the solving instead of following it.
func (r *runner) stream(ctx context.Context, b *batchRun, item func(*item, *client.ResultLine) error) error {
	id, n := b.sub.ID, len(b.items)
	next := 0
	for next < n {
		start, before, pending := time.Now(), next, false
		for l, err := range r.c.Results(ctx, id, client.ResultsOptions{From: next}) {
			if err != nil {
				return fmt.Errorf("batch %s: results: %w", id, err)
			}
			if l.Index < next {
				continue
			}
			if l.Index != next {
				return fmt.Errorf("batch %s: results: item %d where item %d was due", id, l.Index, next)
			}
			if !l.State.Terminal() {
				pending = true
				break
			}
			j := &b.items[next]
			if l.CustomID != nil && *l.CustomID != j.customID {
				return fmt.Errorf("batch %s: results: item %d (line %d) has custom_id %q, the input %q", id, next, j.line, *l.CustomID, j.customID)
			}
			if l.ID == "" {
				l.ID = b.sub.ItemID(next)
			}
			if err := item(j, l); err != nil {
				return err
			}
			next++
			r.noteEnded(b, next)
			if next == n {
				break // all of them; a line past the batch's total is not ours
			}
		}
		if next == n {
			break
		}
		if !pending {
			return fmt.Errorf("batch %s: the results ended after %d of %d items", id, next, n)
		}
		if next == before {
			// Nothing new: wait for the item due, then for the poll's
			// spacing (a server whose long poll returns at once must not
			// be asked in a loop).
			if _, err := r.c.Get(ctx, b.sub.ItemID(next), r.resultsWait); err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if err := sleepCtx(ctx, minResultsPoll-time.Since(start)); err != nil {
				return err
			}
		}
	}
	b.finished.Store(true)
	return nil
}

// pollCounts feeds the bar from the counts of the batches whose results
// are not all read yet, whose items end in any order.
func (r *runner) pollCounts(ctx context.Context, batches []*batchRun) {
	t := time.NewTicker(max(r.countsEvery, 100*time.Millisecond))
	defer t.Stop()
	for {
		for _, b := range batches {
			select {
			case <-b.submitted:
			default:
				continue
			}
			if b.sub == nil || b.finished.Load() {
				continue
			}
			bt, err := r.c.GetBatch(ctx, b.sub.ID, "", 1, 0)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue // the results are what counts; the bar can lag
			}
			r.noteEnded(b, bt.Counts.Ended())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// noteBaseline reads how many items of a replayed batch had ended
// already, and counts them as done before this run (see
// progress.addBaseline). A failure leaves the counts to the polls.
func (r *runner) noteBaseline(ctx context.Context, b *batchRun) {
	bt, err := r.c.GetBatch(ctx, b.sub.ID, "", 1, 0)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := bt.Counts.Ended(); n > b.ended {
		r.progress.addBaseline(n - b.ended)
		r.progress.addCompleted(n - b.ended)
		b.ended = n
	}
}

// noteEnded moves the bar to n ended items of b, if that is more than it
// has seen.
func (r *runner) noteEnded(b *batchRun, n int) {
	if r.progress == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > b.ended {
		r.progress.addCompleted(n - b.ended)
		b.ended = n
	}
}

// sleepCtx sleeps d or until ctx ends, and then returns ctx's cause.
// It is not the client package's sleepCtx: that one is unexported (the
// client exports nothing for its own retries), and it returns ctx.Err(),
// while this one returns context.Cause(ctx), as the CLI's other waits do,
// so an error says why the wait ended.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// remoteSolver solves through the API: one run of batches, results in
// order, so solve prints what --local prints.
type remoteSolver struct {
	g      *globals
	stderr io.Writer
	// webhook, when set, is the completion webhook of each task or
	// batch solve submits (--webhook).
	webhook string
}

// maxSingles is the most requests solve sends as single tasks: a handful
// of boards is someone waiting at a terminal, served by the interactive
// queue, one request each (POST /v1/tasks?wait=) at once. More go as a
// batch, whose work waits in the bulk queue's fair feed.
const maxSingles = 8

func (s remoteSolver) solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed, customIDs []string) ([]json.RawMessage, error) {
	c, err := s.g.client()
	if err != nil {
		return nil, err
	}
	if len(reqs) <= maxSingles {
		// POST /v1/tasks takes no custom_id: the payloads go without
		// theirs, and the order of the answers names the lines.
		return solveSingles(cmd.Context(), c, reqs, s.webhook)
	}
	items := make([]item, len(reqs))
	for i, p := range reqs {
		items[i] = item{line: i + 1, raw: p.Payload()}
		if i >= len(customIDs) || customIDs[i] == "" {
			continue
		}
		// A batch item carries its custom_id: the server names the item
		// by it (results, events), and the run holds the results' echo
		// of it to the input.
		raw, err := client.RawRequest(p.Payload()).WithCustomID(customIDs[i]).MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("case %d: %w", i+1, err)
		}
		items[i].raw, items[i].customID, items[i].hasCustomID = raw, customIDs[i], true
	}
	// A fresh run ID: retries within this run are deduplicated, but
	// solving the same input again solves it again (a task that failed,
	// say on a deadline, is not replayed).
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	r := &runner{c: c, batchSize: defaultBatchSize, parallel: defaultParallel, wait: true, stderr: s.stderr,
		resultsWait: longPoll, countsEvery: time.Second, runID: hex.EncodeToString(nonce[:]), webhook: s.webhook}
	r.progress = newProgress(s.stderr, len(items), true)
	out := make([]json.RawMessage, 0, len(reqs))
	err = r.run(cmd.Context(), items, output{item: func(j *item, l *client.ResultLine) error {
		if l.State != client.StateCompleted {
			return fmt.Errorf("case %d: %s", j.line, taskFailure(l.ID, l.State, l.Error))
		}
		out = append(out, l.Result)
		return nil
	}})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// solveSingles solves each request as a single task, all at once, and
// returns the results in order; the first case that did not complete is
// the error. A webhook, when set, is each task's.
func solveSingles(ctx context.Context, c *client.Client, reqs []*puzzle.Parsed, webhook string) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, p := range reqs {
		wg.Go(func() {
			t, err := c.Solve(ctx, client.RawRequest(p.Payload()), client.WithWait(longPoll), client.WithWebhook(webhook))
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("case %d: %w", i+1, err)
			case t.State != client.StateCompleted:
				errs[i] = fmt.Errorf("case %d: %s", i+1, taskFailure(t.ID, t.State, t.Error))
			default:
				out[i] = t.Result
			}
		})
	}
	wg.Wait()
	if err := firstNonNil(errs); err != nil {
		return nil, err
	}
	return out, nil
}

// taskFailure describes a task that did not complete.
func taskFailure(id string, state client.TaskState, e *client.TaskError) string {
	if e != nil {
		return fmt.Sprintf("task %s %s: %s: %s", id, state, e.Code, e.Message)
	}
	return fmt.Sprintf("task %s %s", id, state)
}

// taskFailedError marks a run in which some task failed: exit status 1.
type taskFailedError struct{ failed, total int }

func (e *taskFailedError) Error() string {
	return strconv.Itoa(e.failed) + " of " + strconv.Itoa(e.total) + " tasks did not complete"
}
