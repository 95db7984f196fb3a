package client_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// The examples run against a real stack (internal/stacktest: a
// redis-server, the API and a worker, in this process), started by the
// first example that asks for it and stopped after the last test.
var exampleStack struct {
	once sync.Once
	s    *stacktest.Stack
	err  error
}

// webhookSecret is the examples' server's WEBHOOK_SECRET.
var webhookSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("puzzleq example webhook key, 32 b"))

// exampleAPI returns the base URL of the examples' stack, starting it on
// first use. Its webhooks may reach this machine, as the example of
// WithWebhook needs.
func exampleAPI() string {
	exampleStack.once.Do(func() {
		s, err := stacktest.Launch(stacktest.Options{Workers: 1, Env: map[string]string{
			"KEY_PREFIX": "cexample:", "WEBHOOK_SECRET": webhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
		}})
		if err == nil {
			err = waitReady(s.URL)
		}
		exampleStack.s, exampleStack.err = s, err
	})
	if exampleStack.err != nil {
		fmt.Fprintln(os.Stderr, "the examples' stack did not start:", exampleStack.err)
		os.Exit(1)
	}
	return exampleStack.s.URL
}

// waitReady polls /readyz until the API answers that it is ready.
func waitReady(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := client.New(url, client.WithRetries(0))
	for {
		h, err := c.Health(ctx)
		if err == nil && h.Ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API was not ready within 20s: %v %+v", err, h)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if exampleStack.s != nil {
		exampleStack.s.Close()
	}
	os.Exit(code)
}
