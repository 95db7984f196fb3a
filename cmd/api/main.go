// Command api serves puzzleq's HTTP API. Without REDIS_URL it runs the
// whole system in one process, for a quick start.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "api: %v\n", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, logOut io.Writer) error {
	// Gin's debug mode prints every route and a warning to stdout; the API
	// logs its requests through slog instead.
	gin.SetMode(gin.ReleaseMode)
	cfg, err := app.LoadAPIConfig(args, os.Getenv, logOut)
	if err != nil {
		return err
	}
	log := cfg.Logger(logOut)
	app.SetMemoryLimit(os.Getenv, app.ReadFile, log)
	app.SetGCHeapFloor(cfg.GCHeapFloor, os.Getenv, log)
	a, err := app.NewAPI(cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}
