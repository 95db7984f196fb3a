package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/client"
)

func newSubmitCmd(g *globals) *cobra.Command {
	var (
		file      string
		outPath   string
		wait      bool
		batchSize int
		parallel  int
		runID     string
		webhook   string
	)
	cmd := &cobra.Command{
		Use:   "submit -f FILE [--wait] [--out FILE]",
		Short: "Submit a file of requests, one JSON request per line",
		Long: `Submit requests in the JSON format of POST /v1/tasks, one per line, as
NDJSON batches. An input within the server's default limits (1,000,000
requests and 256 MiB) is one batch, sent in one request; a larger one, or any
input when --batch-size is set, is cut into batches of at most --batch-size
requests, --parallel sent at once.

A line may name its request with "custom_id" (a string of at most 64 bytes,
unique in the input); it is echoed next to the line number in the results.

Every line is validated as the upload goes, and no batch's upload ends before
every line passed: a bad line cuts it short, is reported with its number and
nothing is submitted (exit status 2), and --out is not created. Each batch
carries an
idempotency key derived from --run-id, its index and its bytes, so a retry
after a lost response, or running the same command again after an
interruption or a failure, does not submit the same work twice. Pass a new
--run-id to submit the same input afresh (say, to re-run tasks that failed).

--webhook URL names every batch's completion webhook: the server POSTs a
signed event to it once the batch has ended (see the README, "Webhooks"). A
URL the server refuses (not public and not in its WEBHOOK_ALLOWED_HOSTS, or a
server without WEBHOOK_SECRET) fails with the server's message, exit status 2.

Without --wait, prints each batch's ID. With --wait, streams the results back
and prints one JSON line per request (-o ndjson, the default), in input
order, as soon as every line before it has ended (-o json prints them as one
array, -o yaml as one sequence, -o table as a table):
  {"line": N, "id": "...", "state": "completed", "result": {...}}
  {"line": N, "custom_id": "...", "id": "...", "state": "failed", "error": {"code": "...", "message": "..."}}
and exits with status 1 if any task did not complete.

A progress bar is drawn on stderr when it is a terminal.`,
		Example: `  # Submit and wait for the results, in order
  puzzlectl submit -f jobs.jsonl --wait --out results.jsonl

  # Read requests from stdin, only print the batch IDs
  generate-puzzles | puzzlectl submit -f -

  # Be told when each batch is done
  puzzlectl submit -f jobs.jsonl --webhook https://hooks.example.com/puzzleq

  # Smaller batches, more at once
  puzzlectl submit -f jobs.jsonl --batch-size 2000 --parallel 8 --wait`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usagef("-f is required: a file of JSON requests, one per line, or - for stdin")
			}
			if batchSize < 1 {
				return usagef("--batch-size must be at least 1, got %d", batchSize)
			}
			if parallel < 1 {
				return usagef("--parallel must be at least 1, got %d", parallel)
			}
			format, c, err := g.remote(formatNDJSON)
			if err != nil {
				return err
			}
			in := cmd.InOrStdin()
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return usagef("%v", err)
				}
				defer f.Close()
				in = f
			}
			items, err := splitLines(in)
			if err != nil {
				return err
			}
			if len(items) == 0 {
				return usagef("%s: no requests", displayName(file))
			}
			// The lines are checked while they are uploaded; --out is
			// created once they all passed, before any batch can be
			// accepted, so a bad line leaves no file and no work behind.
			out := cmd.OutOrStdout()
			var outFile *os.File
			lazy := &lazyWriter{}
			gate := startValidation(items, func() error {
				if outPath == "" {
					lazy.w = out
					return nil
				}
				f, err := os.Create(outPath)
				if err != nil {
					return usagef("%v", err)
				}
				outFile, lazy.w = f, f
				return nil
			})
			lazy.gate = gate
			defer func() {
				gate.settle()
				if outFile != nil {
					outFile.Close()
				}
			}()
			if format == formatTable {
				// The header says whether any line has a custom_id.
				if err := gate.final(); err != nil {
					return gate.failure()
				}
			}
			stderr := cmd.ErrOrStderr()
			r := &runner{c: c, batchSize: batchSize, parallel: parallel, wait: wait, stderr: stderr,
				resultsWait: longPoll, countsEvery: time.Second, runID: runID, resumable: true, gate: gate, webhook: webhook}
			r.progress = newProgress(stderr, len(items), wait)
			ctx, cancel := cmd.Context(), context.CancelFunc(func() {})
			var warned sync.WaitGroup
			if wait {
				// The batch IDs go to stderr as they are accepted, so a
				// run that is stopped can still be followed up.
				// The first accepted batch also asks whether a worker is
				// alive (not before: bad input touches no server).
				var once sync.Once
				r.announce = func(b *batchRun) {
					r.progress.note(stderr, fmt.Sprintf("puzzlectl: batch %s accepted (lines %d-%d)",
						b.sub.ID, b.items[0].line, b.items[len(b.items)-1].line))
					once.Do(func() {
						warned.Add(1)
						go func() { defer warned.Done(); warnNoWorker(ctx, c, r.progress, stderr) }()
					})
				}
				ctx, cancel = g.waitContext(cmd, true)
			}
			defer cancel()
			defer warned.Wait()
			customIDs := false
			if format == formatTable {
				for i := range items {
					customIDs = customIDs || items[i].hasCustomID
				}
			}
			w := bufio.NewWriterSize(lazy, 256<<10)
			var (
				tw *tabwriter.Writer
				lw = newListWriter(w, format) // json, yaml and ndjson
				// lb holds a result line for lw: json and yaml reshape it.
				lb  bytes.Buffer
				lbw = bufio.NewWriter(&lb)
			)
			if format == formatTable {
				tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
				switch {
				case !wait:
					fmt.Fprintln(tw, "BATCH\tTOTAL\tLINES")
				case customIDs:
					fmt.Fprintln(tw, "LINE\tCUSTOM_ID\tID\tSTATE\tRESULT")
				default:
					fmt.Fprintln(tw, "LINE\tID\tSTATE\tRESULT")
				}
			}
			failed := 0
			err = r.run(ctx, items, output{
				batch: func(b *batchRun) error {
					first, last := b.items[0].line, b.items[len(b.items)-1].line
					if tw != nil {
						_, err := fmt.Fprintf(tw, "%s\t%d\t%d-%d\n", b.sub.ID, b.sub.Total, first, last)
						return err
					}
					return lw.add(submittedBatch{b.sub.ID, b.sub.Total, first, last})
				},
				item: func(j *item, l *client.ResultLine) error {
					if l.State != client.StateCompleted {
						failed++
					}
					switch format {
					case formatTable:
						writeResultRow(tw, j, customIDs, l)
					case formatNDJSON:
						// The fast path: a million lines go straight out.
						writeResultLine(w, j, l)
					default:
						lb.Reset()
						writeResultLine(lbw, j, l)
						lbw.Flush()
						return lw.addRaw(lb.Bytes())
					}
					return nil
				},
			})
			if tw != nil {
				tw.Flush()
			}
			if tw == nil && err == nil {
				err = lw.close()
			}
			if ferr := w.Flush(); err == nil && ferr != nil {
				err = ferr
			}
			gate.settle()
			if f := outFile; f != nil {
				outFile = nil
				if cerr := f.Close(); err == nil && cerr != nil {
					err = cerr
				}
			}
			if err != nil {
				return waitError(ctx, err)
			}
			if failed > 0 {
				return &taskFailedError{failed: failed, total: len(items)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "file of JSON requests, one per line; - for stdin")
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for every task and print the results in input order (at most --timeout, when set)")
	cmd.Flags().StringVar(&outPath, "out", "", "write the results to this file instead of stdout")
	cmd.Flags().IntVar(&batchSize, "batch-size", defaultBatchSize, "most requests per batch (at most the server's MAX_BATCH_ITEMS); a batch also stays within 256 MiB")
	cmd.Flags().IntVar(&parallel, "parallel", defaultParallel, "batches submitted at once")
	cmd.Flags().StringVar(&webhook, "webhook", "", "completion webhook URL of every batch (the server POSTs a signed event to it when the batch ends); the same --run-id with another webhook is refused")
	cmd.Flags().StringVar(&runID, "run-id", "", "salt of the batches' idempotency keys; change it to submit the same input again as new work")
	return cmd
}

// submittedBatch is a batch accepted without --wait, as -o json, yaml
// and ndjson print it.
type submittedBatch struct {
	Batch     string `json:"batch"`
	Total     int    `json:"total"`
	FirstLine int    `json:"first_line"`
	LastLine  int    `json:"last_line"`
}

func displayName(file string) string {
	if file == "-" {
		return "stdin"
	}
	return file
}

// writeResultLine writes {"line":N,"custom_id":...,"id":...,"state":...,
// "result"|"error":...}, custom_id only when the input line had one. Built
// by hand: a run writes a line per request, and the result is already
// JSON.
func writeResultLine(w *bufio.Writer, j *item, l *client.ResultLine) {
	w.WriteString(`{"line":`)
	var num [20]byte
	w.Write(strconv.AppendInt(num[:0], int64(j.line), 10))
	if j.hasCustomID {
		w.WriteString(`,"custom_id":`)
		writeJSONString(w, j.customID)
	}
	w.WriteString(`,"id":`)
	writeJSONString(w, l.ID)
	w.WriteString(`,"state":`)
	writeJSONString(w, string(l.State))
	if l.State == client.StateCompleted {
		w.WriteString(`,"result":`)
		w.Write(l.Result)
	} else {
		e := l.Error
		if e == nil {
			e = &client.TaskError{Code: string(l.State), Message: "the task " + string(l.State)}
		}
		eb, _ := json.Marshal(e)
		w.WriteString(`,"error":`)
		w.Write(eb)
	}
	w.WriteString("}\n")
}

// writeJSONString writes s as json.Marshal would: as it is between quotes
// when no byte of it needs an escape (IDs and states never do), else
// through json.Marshal.
func writeJSONString(w *bufio.Writer, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			w.Write(b)
			return
		}
	}
	w.WriteByte('"')
	w.WriteString(s)
	w.WriteByte('"')
}

// writeResultRow writes a table row; the CUSTOM_ID column is there when
// some line of the input has a custom_id.
func writeResultRow(w io.Writer, j *item, customIDs bool, l *client.ResultLine) {
	var what string
	switch {
	case l.State == client.StateCompleted:
		what = string(l.Result)
	case l.Error != nil:
		what = l.Error.Code + ": " + l.Error.Message
	}
	if customIDs {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", j.line, j.customID, l.ID, l.State, what)
		return
	}
	fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", j.line, l.ID, l.State, what)
}

// readItems reads every non-blank line and validates it as the API would
// (decodeItem: the request and its custom_id), in parallel. The first bad
// line (by number) is the error. submit validates while it uploads
// (validation); this is the same check, all at once.
func readItems(in io.Reader) ([]item, error) {
	items, err := splitLines(in)
	if err != nil {
		return nil, err
	}
	if err := validateAll(items); err != nil {
		return nil, err
	}
	return items, nil
}

// lazyWriter writes to w, which the gate's ready sets: the output of a
// run, opened once its input passed.
type lazyWriter struct {
	gate *validation
	w    io.Writer
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if err := l.gate.final(); err != nil { // and see what ready set
		return 0, l.gate.failure()
	}
	return l.w.Write(p)
}

func firstNonNil(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// warnNoWorker warns on stderr when the server says no worker is alive:
// the run would otherwise sit at 0% with nothing to say why. A server
// that cannot say (an older one, or an error) gets no warning; the run
// reports its own errors.
func warnNoWorker(ctx context.Context, c *client.Client, p *progress, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil || st.WorkersAlive > 0 {
		return
	}
	p.note(stderr, fmt.Sprintf("puzzlectl: warning: no worker is alive at %s: the tasks are accepted but wait until one starts (see puzzlectl health)", c.BaseURL()))
}
