// Command worker runs puzzleq's solvers on tasks from Redis. Run as many
// as the load needs; they share one Redis.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/puzzleq/puzzleq/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, logOut io.Writer) error {
	cfg, err := app.LoadWorkerConfig(args, os.Getenv, logOut)
	if err != nil {
		return err
	}
	log := cfg.Logger(logOut)
	app.SetMemoryLimit(os.Getenv, app.ReadFile, log)
	app.SetGCHeapFloor(cfg.GCHeapFloor, os.Getenv, log)
	w, err := app.NewWorker(cfg, log)
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Run(ctx)
}
