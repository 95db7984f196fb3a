package cli

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/puzzle"
)

// Shell completion: cobra's "completion" command writes the scripts for
// bash, zsh, fish and PowerShell; the functions here complete flag values
// and the IDs of the API key's newest tasks and batches.

// completeTimeout bounds the API call behind a completion: a shell waits
// for it at every Tab, so a slow or absent server must not hang the prompt.
const completeTimeout = 2 * time.Second

// completeIDs is how many of the newest tasks or batches a completion
// offers.
const completeIDs = 100

// fixedValues completes a flag whose values are a fixed list.
func fixedValues(values ...string) cobra.CompletionFunc {
	return func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// registerFlagCompletions completes the values of the flags that have a
// fixed set, wherever they are defined.
func registerFlagCompletions(root *cobra.Command) {
	var states []string
	for _, s := range apitype.TaskStates() {
		states = append(states, string(s))
	}
	var formats, kinds []string
	for _, f := range puzzle.Formats {
		formats = append(formats, string(f))
	}
	for _, k := range puzzle.Kinds {
		kinds = append(kinds, string(k))
	}
	byFlag := map[string]cobra.CompletionFunc{
		"output": fixedValues(outputFormats...),
		"state":  fixedValues(states...),
		"kind":   fixedValues(kinds...),
		"format": fixedValues(formats...),
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for name, f := range byFlag {
			fl := c.LocalNonPersistentFlags().Lookup(name)
			if c == root {
				fl = c.PersistentFlags().Lookup(name)
			}
			if fl != nil {
				_ = c.RegisterFlagCompletionFunc(name, f)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// completeTaskIDs offers the newest single tasks' IDs, with their kind and
// state as the description.
func completeTaskIDs(g *globals) cobra.CompletionFunc {
	return completeOneID(g, func(ctx context.Context, c *client.Client) ([]cobra.Completion, error) {
		l, err := c.ListTasks(ctx, client.ListOptions{Limit: completeIDs})
		if err != nil {
			return nil, err
		}
		var out []cobra.Completion
		for _, t := range l.Tasks {
			out = append(out, cobra.CompletionWithDesc(t.ID, t.Kind+" "+string(t.State)))
		}
		return out, nil
	})
}

// completeBatchIDs offers the newest batches' IDs, with their state and
// size as the description.
func completeBatchIDs(g *globals) cobra.CompletionFunc {
	return completeOneID(g, func(ctx context.Context, c *client.Client) ([]cobra.Completion, error) {
		l, err := c.ListBatches(ctx, client.ListOptions{Limit: completeIDs})
		if err != nil {
			return nil, err
		}
		var out []cobra.Completion
		for _, b := range l.Batches {
			out = append(out, cobra.CompletionWithDesc(b.ID, string(b.State)+", "+plural(b.Total, "task")))
		}
		return out, nil
	})
}

// completeOneID completes a command's one ID argument from list. Nothing
// is offered once the ID is given, or when the server cannot answer in
// completeTimeout: completion never prints an error into the shell.
func completeOneID(g *globals, list func(context.Context, *client.Client) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := g.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
		defer cancel()
		all, err := list(ctx, c)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, v := range all {
			if strings.HasPrefix(v, toComplete) {
				out = append(out, v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
