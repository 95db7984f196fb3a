package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/client"
)

// longPoll is the wait of each long poll; the server caps it (MAX_WAIT,
// 60s by default).
const longPoll = 30 * time.Second

func newGetCmd(g *globals) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a task",
		Long: `Show a task: its state, the progress of a long search (the IDA* bound
and the nodes searched, for large sliding boards) and, once it has ended,
its result or error. Exits with status 1 if the task failed or was
canceled.`,
		Example: `  puzzlectl get 5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b
  puzzlectl get 5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b --wait -o json`,
		Args:              exactArgs(1, "a task ID"),
		ValidArgsFunction: completeTaskIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			ctx, cancel := g.waitContext(cmd, wait)
			defer cancel()
			t, err := c.Get(ctx, args[0], 0)
			for err == nil && wait && !t.Terminal() {
				t, err = c.Get(ctx, args[0], longPoll)
			}
			if err != nil {
				return waitError(ctx, err)
			}
			if err := printTask(cmd.OutOrStdout(), format, t); err != nil {
				return err
			}
			return taskExit(t)
		},
	}
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait until the task has ended (at most --timeout, when set)")
	return cmd
}

func newCancelCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task that has not ended",
		Long: `Cancel a task: a pending task never runs, a running one stops within
milliseconds. Cancelling a task that was canceled before answers it again;
cancelling one that completed or failed is a conflict (status 6).`,
		Example:           `  puzzlectl cancel 5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b`,
		Args:              exactArgs(1, "a task ID"),
		ValidArgsFunction: completeTaskIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			t, err := c.Cancel(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printTask(cmd.OutOrStdout(), format, t)
		},
	}
}

func newDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a single task that has ended",
		Long: `Delete a single task that has ended (completed, failed or canceled): from
then on it is not found. A task that has not ended is a conflict (status 6):
cancel it first. A batch's items are deleted with their batch: "puzzlectl
batch delete BATCH". Records are otherwise deleted when they expire
(RESULT_TTL).`,
		Example:           `  puzzlectl delete 5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b`,
		Args:              exactArgs(1, "a task ID"),
		ValidArgsFunction: completeTaskIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			if err := c.DeleteTask(cmd.Context(), args[0]); err != nil {
				return err
			}
			return printDeleted(cmd.OutOrStdout(), format, args[0])
		},
	}
}

func newRetryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Run a failed or canceled batch item again",
		Long: `Run one failed or canceled batch item again, with the same ID and
custom_id; it counts against the API key's quota again. An item that has not
ended is printed as it is. A completed item, a single task (submit its request
again instead) and a cheap item whose chunk still runs other items are a
conflict (status 6). "puzzlectl batch retry BATCH" retries every failed and
canceled item of a batch.`,
		Example:           `  puzzlectl retry 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-41`,
		Args:              exactArgs(1, "a batch item's ID"),
		ValidArgsFunction: completeTaskIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			t, err := c.Retry(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printTask(cmd.OutOrStdout(), format, t)
		},
	}
}

func newBatchCmd(g *globals) *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "batch ID | batch cancel ID | batch retry ID | batch delete ID",
		Short: "Show, cancel, retry or delete a batch",
		Long: `Show a batch's counts per state and whether every task has ended. With
--watch, keep showing the counts as they change until the batch is done
(-o ndjson prints a line per change; -o json and -o yaml print the final
counts once).
Exits with status 1 if a task of a finished batch failed or was canceled.

"batch cancel ID" cancels the tasks that have not ended; "batch retry ID"
runs the failed and canceled tasks again, with the same IDs; "batch delete ID"
deletes a batch whose tasks have all ended, with its results.`,
		Example: `  puzzlectl batch 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f
  puzzlectl batch 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f --watch --timeout 10m
  puzzlectl batch cancel 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f
  puzzlectl batch retry 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f
  puzzlectl batch delete 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f`,
		Args:              exactArgs(1, "a batch ID"),
		ValidArgsFunction: completeBatchIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, c, err := g.remote(formatTable)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tty := isTerminal(out)
			ctx, cancel := g.waitContext(cmd, watch)
			defer cancel()
			var last *client.Batch
			for first := true; ; first = false {
				wait := time.Duration(0)
				if watch && !first {
					wait = time.Second
				}
				b, err := c.GetBatch(ctx, args[0], "", 1, wait)
				if err != nil {
					if tty && !first && format == formatTable {
						fmt.Fprintln(out)
					}
					return waitError(ctx, err)
				}
				b.Tasks, b.NextCursor = nil, nil
				if !watch {
					if err := printBatch(out, format, b, true); err != nil {
						return err
					}
					return batchExit(b)
				}
				// json and yaml are one document: the counts once the
				// batch is done. ndjson and a table stream each change.
				changed := last == nil || b.Counts != last.Counts || b.Done != last.Done
				switch {
				case !changed:
				case format == formatJSON || format == formatYAML:
					if b.Done {
						if err := printBatch(out, format, b, true); err != nil {
							return err
						}
					}
				case tty && format == formatTable:
					fmt.Fprint(out, "\r\x1b[K")
					if err := printBatchLine(out, b); err != nil {
						return err
					}
				default:
					if err := printBatch(out, format, b, first); err != nil {
						return err
					}
				}
				last = b
				if b.Done {
					if tty && format == formatTable {
						fmt.Fprintln(out)
					}
					return batchExit(b)
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "W", false, "keep showing the counts until the batch is done (at most --timeout, when set)")
	cmd.AddCommand(newBatchCancelCmd(g), newBatchRetryCmd(g), newBatchDeleteCmd(g))
	return cmd
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %s, got %d arguments; see %s --help", cmd.CommandPath(), what, len(args), cmd.CommandPath())
		}
		return nil
	}
}

func printTask(w io.Writer, format string, t *client.Task) error {
	if format != formatTable {
		return writeDoc(w, format, t)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	header, row := "ID\tKIND\tSTATE", fmt.Sprintf("%s\t%s\t%s", t.ID, t.Kind, t.State)
	// A long search reports its progress; other tasks have none, and
	// their table has no column for it.
	if p := t.Progress; p != nil {
		header += "\tPROGRESS"
		row += fmt.Sprintf("\tbound %d, %d nodes", p.Bound, p.Nodes)
	}
	fmt.Fprintln(tw, header+"\tRESULT")
	fmt.Fprintln(tw, row+"\t"+outcome(t.State, t.Result, t.Error))
	return tw.Flush()
}

// batchDoc is a batch's counts as -o json, yaml and ndjson print them.
type batchDoc struct {
	ID     string        `json:"id"`
	Total  int           `json:"total"`
	Counts client.Counts `json:"counts"`
	Done   bool          `json:"done"`
}

// outcome is a task's RESULT column: its result once completed, else its
// error, if any.
func outcome(st client.TaskState, result []byte, e *client.TaskError) string {
	switch {
	case st == client.StateCompleted:
		return string(result)
	case e != nil:
		return e.Code + ": " + e.Message
	}
	return ""
}

func printBatch(w io.Writer, format string, b *client.Batch, header bool) error {
	if format != formatTable {
		return writeDoc(w, format, batchDoc{b.ID, b.Total, b.Counts, b.Done})
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "ID\tTOTAL\tPENDING\tACTIVE\tCOMPLETED\tFAILED\tCANCELED\tDONE")
	}
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%t\n", b.ID, b.Total, b.Counts.Pending, b.Counts.Active,
		b.Counts.Completed, b.Counts.Failed, b.Counts.Canceled, b.Done)
	return tw.Flush()
}

// printBatchLine is the one-line live form of --watch on a terminal.
func printBatchLine(w io.Writer, b *client.Batch) error {
	_, err := fmt.Fprintf(w, "%s  %d/%d ended  pending %d  active %d  completed %d  failed %d  canceled %d",
		b.ID, b.Counts.Ended(), b.Total, b.Counts.Pending, b.Counts.Active, b.Counts.Completed, b.Counts.Failed, b.Counts.Canceled)
	return err
}

func taskExit(t *client.Task) error {
	if t.Terminal() && t.State != client.StateCompleted {
		return &taskFailedError{failed: 1, total: 1}
	}
	return nil
}

func batchExit(b *client.Batch) error {
	if b.Done && b.Counts.Failed+b.Counts.Canceled > 0 {
		return &taskFailedError{failed: b.Counts.Failed + b.Counts.Canceled, total: b.Total}
	}
	return nil
}
