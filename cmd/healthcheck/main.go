// Command healthcheck GETs one URL and exits 0 when it answers 2xx, 1
// otherwise (2 on bad arguments). It exists because puzzleq's image has no
// shell and no curl: docker compose's healthchecks run it inside the
// container, e.g.
//
//	healthcheck -url http://127.0.0.1:8080/readyz
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "URL to GET")
	timeout := fs.Duration("timeout", 3*time.Second, "deadline of the request")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 || *timeout <= 0 {
		fmt.Fprintln(stderr, "usage: healthcheck [-url URL] [-timeout D]")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintf(stderr, "healthcheck: %s: %s\n", *url, resp.Status)
		return 1
	}
	return 0
}
