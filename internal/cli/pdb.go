package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/solvers/sliding"
)

func newPDBCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pdb",
		Short: "Build or verify the 15-puzzle's pattern database files",
		Long: `The 15-puzzle is solved with additive pattern databases. The 7-8 set
(288 MB) is built once into a directory, which workers (PDB_DIR) and
solve --local ($PDB_DIR, else the user cache directory) map read-only;
without its files 4x4 boards use the 6-6-3 set (5.8 MB, built in seconds).`,
	}
	cmd.AddCommand(newPDBBuildCmd(), newPDBVerifyCmd())
	return cmd
}

func newPDBBuildCmd() *cobra.Command {
	var set string
	cmd := &cobra.Command{
		Use:   "build DIR",
		Short: "Build the pattern database files into DIR (kept when intact)",
		Long: `Build the files of a table set into DIR, creating it; files already there
and intact are kept. The 7-8 set takes minutes of CPU and about 1.4 GB of
memory (the 8-tile database's scratch); run it once per host or volume.`,
		Example: `  nice -n 10 puzzlectl pdb build /var/lib/puzzleq/pdb`,
		Args:    exactArgs(1, "a directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := sliding.ParseTableSet(set)
			if err != nil {
				return usageError{err}
			}
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "building the %s tables into %s\n", ts, dir)
			_, err = sliding.BuildTables(cmd.Context(), dir, ts, func(f sliding.TableFile) {
				state := "kept"
				if f.Built {
					state = "built"
				}
				fmt.Fprintf(out, "%s\t%s\t%d bytes\t%v\n", f.Name, state, f.Bytes, f.Took.Round(time.Millisecond))
			})
			if err != nil {
				return err
			}
			// The other searched shapes' tables too (seconds), so that a
			// worker's first start with this directory builds nothing.
			if err := sliding.UseTables(dir, ts); err != nil {
				return err
			}
			t0 := time.Now()
			if err := sliding.Preload(cmd.Context(), dir); err != nil {
				return err
			}
			fmt.Fprintf(out, "other shapes' tables ready in %v\n", time.Since(t0).Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&set, "set", string(sliding.Set78), "table set: 78 or 663")
	return cmd
}

func newPDBVerifyCmd() *cobra.Command {
	var set string
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Check the pattern database files in DIR against their checksums",
		Long: `Check every file of a table set in DIR: header, size and the SHA-256 of
its entries. Exits with status 1 when one is missing or damaged.`,
		Example: `  puzzlectl pdb verify /var/lib/puzzleq/pdb`,
		Args:    exactArgs(1, "a directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := sliding.ParseTableSet(set)
			if err != nil {
				return usageError{err}
			}
			files, err := sliding.VerifyTables(args[0], ts)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			for _, f := range files {
				state := "ok"
				if f.Err != nil {
					state = f.Err.Error()
				}
				fmt.Fprintf(tw, "%s\t%d bytes\t%s\n", f.Name, f.Bytes, state)
			}
			if ferr := tw.Flush(); err == nil {
				err = ferr
			}
			return err
		},
	}
	cmd.Flags().StringVar(&set, "set", string(sliding.Set78), "table set: 78 or 663")
	return cmd
}

// usePDBDir points the 15-puzzle's solver at its table files: $PDB_DIR,
// else the user's cache directory (os.UserCacheDir()/puzzleq:
// ~/.cache/puzzleq on Linux). The 7-8 files there, built by puzzlectl pdb
// build, are mapped, so a local solve pays no table build; without them
// the 6-6-3 tables are kept there, so only the first local solve of a
// large board builds them (seconds) and later runs read them
// (milliseconds). $PDB_SET=663 skips the 7-8 files. Without a usable
// directory the tables are built in memory, with a note on stderr.
func usePDBDir(stderr io.Writer) {
	dir := os.Getenv("PDB_DIR")
	var err error
	if dir == "" {
		var base string
		if base, err = os.UserCacheDir(); err == nil {
			dir = filepath.Join(base, "puzzleq")
		}
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintf(stderr, "puzzlectl: note: no cache directory for the pattern databases (%v); large sliding boards build them on every run\n", err)
		return
	}
	sliding.UseCacheDir(dir)
	set := sliding.Set78
	if s := os.Getenv("PDB_SET"); s != "" {
		if set, err = sliding.ParseTableSet(s); err != nil {
			fmt.Fprintf(stderr, "puzzlectl: note: PDB_SET: %v; using 6-6-3\n", err)
			return
		}
	}
	if err := sliding.UseTables(dir, set); err != nil && os.Getenv("PDB_SET") != "" {
		// Asked for explicitly: say why 4x4 is slower than expected.
		fmt.Fprintf(stderr, "puzzlectl: note: %v; using 6-6-3 (build them with puzzlectl pdb build %s)\n", err, dir)
	}
}
