// Command receiver is a module of its own that verifies a puzzleq webhook
// with webhook.Verify, as a Go receiver outside this repository does. It
// reads the body on stdin and the headers from its arguments, and exits 0
// when the webhook verifies, 1 when it does not.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/puzzleq/puzzleq/webhook"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: receiver SECRET WEBHOOK-ID WEBHOOK-TIMESTAMP WEBHOOK-SIGNATURE < body")
		os.Exit(2)
	}
	body, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	h := http.Header{}
	h.Set("webhook-id", os.Args[2])
	h.Set("webhook-timestamp", os.Args[3])
	h.Set("webhook-signature", os.Args[4])
	if err := webhook.Verify(os.Args[1], h, body, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("verified")
}
