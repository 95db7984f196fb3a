package cli

// The commands that cover the rest of the API: results, list, batch
// cancel and retry, health with the workers' presence, and version.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/client"
)

// Version is puzzlectl's version: set at build time with
// -ldflags "-X github.com/puzzleq/puzzleq/internal/cli.Version=v1.2.3";
// when unset it is read from the build's module and VCS information.
var Version = ""

func init() {
	if Version == "" {
		Version = buildVersion()
	}
}

// buildVersion describes the build from its module version and VCS
// stamp: "(devel) 1a6e97c 2026-11-30T09:00:00Z dirty".
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	parts := []string{bi.Main.Version}
	if parts[0] == "" {
		parts[0] = "(devel)"
	}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	for _, p := range []string{rev, at, dirty} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, " ") + " " + bi.GoVersion
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print puzzlectl's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "puzzlectl %s\n", Version)
			return err
		},
	}
}

// errWaitTimeout marks a --wait or --watch that --timeout cut short.
var errWaitTimeout = errors.New("gave up waiting")

// waitContext is the context of a command's wait: bounded by --timeout
// when it was set, unbounded (but for Ctrl-C) when it was not, since its
// default is the timeout of one request, not of a wait.
func (g *globals) waitContext(cmd *cobra.Command, waiting bool) (context.Context, context.CancelFunc) {
	if f := cmd.Flag("timeout"); !waiting || f == nil || !f.Changed {
		return context.WithCancel(cmd.Context())
	}
	return context.WithTimeoutCause(cmd.Context(), g.timeout, fmt.Errorf("%w: --timeout %s passed", errWaitTimeout, g.timeout))
}

// waitError is err, or the wait's own timeout when that is what ended it.
func waitError(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errWaitTimeout) {
		return cause
	}
	return err
}

func newResultsCmd(g *globals) *cobra.Command {
	var (
		wait  bool
		state string
	)
	cmd := &cobra.Command{
		Use:   "results BATCH [--wait] [--state failed]",
		Short: "Print a batch's results, one NDJSON line per task",
		Long: `Print the lines of GET /v1/batches/{id}/results: one JSON object per task,
in submission order, with its index, id, custom_id, state and its result or
error (-o json prints them as one array, -o yaml as one sequence, -o table
as a table). Tasks that have not ended show their state; with --wait, it first
waits for the batch to be done (at most --timeout, when set). With --state,
only the tasks in that state are printed. Exits with status 1 if a task
printed failed or was canceled.`,
		Example: `  puzzlectl results 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f --wait > results.jsonl
  puzzlectl results 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f --state failed | jq -r .error.code`,
		Args:              exactArgs(1, "a batch ID"),
		ValidArgsFunction: completeBatchIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := stateFlag(state)
			if err != nil {
				return err
			}
			format, c, err := g.remote(formatNDJSON)
			if err != nil {
				return err
			}
			ctx, cancel := g.waitContext(cmd, wait)
			defer cancel()
			id := args[0]
			if wait {
				for {
					b, err := c.GetBatch(ctx, id, "", 1, longPoll)
					if err != nil {
						return waitError(ctx, err)
					}
					if b.Done {
						break
					}
				}
			}
			out := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
			defer out.Flush()
			lw := newListWriter(out, format)
			tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			if format == formatTable {
				fmt.Fprintln(tw, "INDEX\tID\tCUSTOM_ID\tSTATE\tRESULT")
			}
			failed, total := 0, 0
			for l, err := range c.Results(ctx, id, client.ResultsOptions{State: st}) {
				if err != nil {
					tw.Flush()
					return waitError(ctx, err)
				}
				if format == formatTable {
					err = printResultRow(tw, l)
				} else {
					err = lw.add(l)
				}
				if err != nil {
					return err
				}
				total++
				if l.State == client.StateFailed || l.State == client.StateCanceled {
					failed++
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if err := lw.close(); err != nil {
				return err
			}
			if failed > 0 {
				return &taskFailedError{failed: failed, total: total}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the batch to be done first (at most --timeout, when set)")
	cmd.Flags().StringVar(&state, "state", "", "print only the tasks in this state: pending, active, completed, failed or canceled")
	return cmd
}

// stateFlag reads a --state value; "" is any state.
func stateFlag(v string) (client.TaskState, error) {
	if v == "" {
		return "", nil
	}
	for _, s := range apitype.TaskStates() {
		if string(s) == v {
			return s, nil
		}
	}
	return "", usagef("--state must be one of pending, active, completed, failed or canceled, got %q", v)
}

func newListCmd(g *globals) *cobra.Command {
	var (
		state, kind, after string
		limit              int
		all                bool
	)
	cmd := &cobra.Command{
		Use:   "list [batches|tasks]",
		Short: "List your batches or single tasks, newest first",
		Long: `List the API key's batches (the default) or single tasks, newest first.
A batch's state is pending, active, completed (every task completed),
failed (some task did not) or canceled. --state, --kind and --created-after
filter; --limit bounds the page, and --all reads every page.`,
		Example: `  puzzlectl list
  puzzlectl list batches --state failed
  puzzlectl list tasks --kind sweep --created-after 2026-11-30T09:00:00Z -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 || (len(args) == 1 && args[0] != "batches" && args[0] != "tasks") {
				return usagef("%s takes batches or tasks, got %q; see %s --help", cmd.CommandPath(), strings.Join(args, " "), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := g.outputFormat(formatTable)
			if err != nil {
				return err
			}
			st, err := stateFlag(state)
			if err != nil {
				return err
			}
			if limit < 1 || limit > 1000 {
				return usagef("--limit must be between 1 and 1000, got %d", limit)
			}
			o := client.ListOptions{State: st, Kind: kind, Limit: limit}
			if after != "" {
				if o.CreatedAfter, err = time.Parse(time.RFC3339Nano, after); err != nil {
					return usagef("--created-after must be an RFC 3339 time such as 2026-11-30T09:00:00Z, got %q", after)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			lw := newListWriter(out, format)
			tasks := len(args) == 1 && args[0] == "tasks"
			if format == formatTable {
				if tasks {
					fmt.Fprintln(tw, "ID\tKIND\tSTATE\tCREATED\tRESULT")
				} else {
					fmt.Fprintln(tw, "ID\tSTATE\tTOTAL\tPENDING\tACTIVE\tCOMPLETED\tFAILED\tCANCELED\tKINDS\tCREATED")
				}
			}
			for {
				var next *string
				if tasks {
					l, err := c.ListTasks(cmd.Context(), o)
					if err != nil {
						return err
					}
					for _, t := range l.Tasks {
						if err := printTaskRow(tw, lw, &t); err != nil {
							return err
						}
					}
					next = l.NextCursor
				} else {
					l, err := c.ListBatches(cmd.Context(), o)
					if err != nil {
						return err
					}
					for _, b := range l.Batches {
						if err := printBatchRow(tw, lw, &b); err != nil {
							return err
						}
					}
					next = l.NextCursor
				}
				if next == nil || !all {
					if next != nil {
						tw.Flush()
						fmt.Fprintln(cmd.ErrOrStderr(), "more on the next pages: --all reads them")
					}
					break
				}
				o.Cursor = *next
			}
			if format != formatTable {
				return lw.close()
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only those in this state: pending, active, completed, failed or canceled")
	cmd.Flags().StringVar(&kind, "kind", "", "only tasks of this kind (sliding, sweep, fill), or batches with one")
	cmd.Flags().StringVar(&after, "created-after", "", "only those created after this RFC 3339 time")
	cmd.Flags().IntVar(&limit, "limit", 20, "most per page (1 to 1000)")
	cmd.Flags().BoolVar(&all, "all", false, "read every page")
	return cmd
}

func createdOf(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

// printBatchRow writes b as a row of tw, or as an item of lw unless the
// format is a table.
func printBatchRow(tw io.Writer, lw *listWriter, b *client.BatchSummary) error {
	if lw.format != formatTable {
		return lw.add(b)
	}
	c := b.Counts
	_, err := fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", b.ID, b.State, b.Total, c.Pending, c.Active,
		c.Completed, c.Failed, c.Canceled, strings.Join(b.Kinds, ","), createdOf(b.CreatedAt))
	return err
}

func printResultRow(tw io.Writer, l *client.ResultLine) error {
	what := outcome(l.State, l.Result, l.Error)
	cid := "-"
	if l.CustomID != nil {
		cid = *l.CustomID
	}
	_, err := fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", l.Index, l.ID, cid, l.State, what)
	return err
}

func printTaskRow(tw io.Writer, lw *listWriter, t *client.Task) error {
	if lw.format != formatTable {
		return lw.add(t)
	}
	what := outcome(t.State, t.Result, t.Error)
	if t.State == client.StateCompleted && len(what) > 60 {
		what = what[:57] + "..."
	}
	_, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, t.State, createdOf(t.CreatedAt), what)
	return err
}

func newBatchCancelCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "cancel BATCH",
		Short:             "Cancel every task of a batch that has not ended",
		Example:           `  puzzlectl batch cancel 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f`,
		Args:              exactArgs(1, "a batch ID"),
		ValidArgsFunction: completeBatchIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			n, err := c.CancelBatch(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if format != formatTable {
				return writeDoc(cmd.OutOrStdout(), format, apitype.BatchCanceled{ID: args[0], Canceled: n})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: canceled %d tasks\n", args[0], n)
			return err
		},
	}
}

func newBatchDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete BATCH",
		Short: "Delete a batch whose tasks have all ended, with its results",
		Long: `Delete a batch whose tasks have all ended (completed, failed or canceled),
with its tasks and results: from then on they are not found. A batch with
tasks that have not ended is a conflict (status 6): cancel it first with
"puzzlectl batch cancel BATCH", and wait for it to end. Records are otherwise
deleted when they expire (RESULT_TTL).`,
		Example:           `  puzzlectl batch delete 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f`,
		Args:              exactArgs(1, "a batch ID"),
		ValidArgsFunction: completeBatchIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			if err := c.DeleteBatch(cmd.Context(), args[0]); err != nil {
				return err
			}
			return printDeleted(cmd.OutOrStdout(), format, args[0])
		},
	}
}

// printDeleted reports that a delete of id succeeded: a line for people,
// or {"id", "deleted": true} as one document.
func printDeleted(w io.Writer, format, id string) error {
	if format != formatTable {
		return writeDoc(w, format, map[string]any{"id": id, "deleted": true})
	}
	_, err := fmt.Fprintf(w, "%s: deleted\n", id)
	return err
}

func newBatchRetryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retry BATCH",
		Short: "Run a batch's failed and canceled tasks again",
		Long: `Run the failed and canceled tasks of a batch again, with the same IDs and
custom_ids; they count against the API key's quota again. (While the batch
runs, a task whose chunk still runs waits for a later retry; in a done batch
every one is retried.) Follow them with "puzzlectl batch BATCH --watch" or
"puzzlectl results BATCH --wait".`,
		Example:           `  puzzlectl batch retry 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f`,
		Args:              exactArgs(1, "a batch ID"),
		ValidArgsFunction: completeBatchIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			n, err := c.RetryBatch(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if format != formatTable {
				return writeDoc(cmd.OutOrStdout(), format, apitype.BatchRetried{ID: args[0], Retried: n, Complete: true})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: retrying %d tasks\n", args[0], n)
			return err
		},
	}
}

// defaultMaxPendingAge is how long work may wait before health calls the
// service unhealthy: far longer than a healthy queue holds anything, far
// shorter than anyone waits without asking why.
const defaultMaxPendingAge = 5 * time.Minute

func newHealthCmd(g *globals) *cobra.Command {
	var maxAge time.Duration
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check that the server is live and ready, and that a worker is alive",
		Long: `Check the server's /healthz (the process answers), /readyz (it can reach
Redis) and /v1/status: how many workers are alive, their slots, and how long
the oldest waiting work has waited. Exits with status 1 when it is live but
not ready, when no worker is alive (tasks are accepted, but nothing runs) or
when work has waited longer than --max-pending-age; 3 when it cannot be
reached, and 4 when the API key is refused.`,
		Example: `  puzzlectl health
  puzzlectl health --server https://puzzleq.example.com -o json
  puzzlectl health --max-pending-age 1m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := g.outputFormat(formatTable)
			if err != nil {
				return err
			}
			if maxAge <= 0 {
				return usagef("--max-pending-age must be positive, got %s", maxAge)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			h, err := c.Health(cmd.Context())
			if err != nil {
				return err
			}
			var st *client.ServiceStatus
			if h.Ready {
				if st, err = c.Status(cmd.Context()); err != nil {
					return err
				}
			}
			var problems []string
			if !h.Ready {
				problems = append(problems, "server is not ready: "+h.Reason)
			}
			if st != nil && st.WorkersAlive == 0 {
				problems = append(problems, "no worker is alive: tasks are accepted but nothing runs; start one (cmd/worker)")
			}
			if st != nil && st.OldestPendingSeconds > maxAge.Seconds() {
				problems = append(problems, fmt.Sprintf("work has waited %s, longer than --max-pending-age %s",
					(time.Duration(st.OldestPendingSeconds*float64(time.Second))).Round(time.Second), maxAge))
			}
			out := cmd.OutOrStdout()
			if format != formatTable {
				if err := writeDoc(out, format, struct {
					Server string `json:"server"`
					*client.Health
					Status *client.ServiceStatus `json:"status,omitempty"`
				}{c.BaseURL(), h, st}); err != nil {
					return err
				}
			} else {
				ready := "ready"
				if !h.Ready {
					ready = "not ready: " + h.Reason
				}
				line := fmt.Sprintf("%s: live, %s", c.BaseURL(), ready)
				if st != nil {
					line += fmt.Sprintf(", %s alive (%s, %d busy)", plural(st.WorkersAlive, "worker"), plural(st.Slots, "slot"), st.Busy)
					for _, q := range st.Queues {
						line += fmt.Sprintf(", %s %d pending", q.Name, q.Pending)
						if q.Waiting > 0 {
							line += fmt.Sprintf(" and %d waiting for a slot", q.Waiting)
						}
					}
					if st.OldestPendingSeconds > 0 {
						line += fmt.Sprintf(", oldest waiting %.1fs", st.OldestPendingSeconds)
					}
				}
				fmt.Fprintln(out, line)
			}
			if len(problems) > 0 {
				return errors.New(strings.Join(problems, "; "))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&maxAge, "max-pending-age", defaultMaxPendingAge, "unhealthy when work has waited longer than this")
	return cmd
}
