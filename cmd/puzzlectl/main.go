// Command puzzlectl solves puzzles locally or through a puzzleq API, and
// reads and writes the classic judge formats.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/puzzleq/puzzleq/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
