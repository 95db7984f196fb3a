package app_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestShutdownAnswersKeptAliveConnections is the API side of a rolling
// restart: a client's kept-alive connection still leads to a replica
// that got SIGTERM (the load balancer only stops new connections). Its
// next submission on that connection must be answered, with Connection:
// close so that the one after goes elsewhere, and not met by a closed
// socket: a reset on a POST leaves the client unable to tell whether the
// task was taken. Once that connection has closed, the shutdown goes on
// without waiting out DRAIN_TIME.
func TestShutdownAnswersKeptAliveConnections(t *testing.T) {
	t.Parallel()
	const drain = 20 * time.Second
	st := stacktest.Start(t, stacktest.Options{APIEnv: map[string]string{"DRAIN_TIME": drain.String()}})
	addr := strings.TrimPrefix(st.URL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	submit := func(i int) *http.Response {
		t.Helper()
		body := sample8
		fmt.Fprintf(conn, "POST /v1/tasks HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("submission %d on the kept-alive connection: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("submission %d: %d %s", i, resp.StatusCode, b)
		}
		return resp
	}
	if resp := submit(1); resp.Close {
		t.Fatal("the API closes connections before shutting down")
	}

	st.TerminateAPI()
	// The harness's own kept-alive connection (its readiness wait) goes
	// now, so that this test's is the last.
	http.DefaultClient.CloseIdleConnections()
	// Readiness fails once the drain has begun.
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := probe.Get(st.URL + "/readyz")
		if err != nil {
			t.Fatalf("/readyz while draining: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 10s after the shutdown began", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
	closedAt := time.Now()
	if resp := submit(2); !resp.Close {
		t.Error("an answer while draining does not close its connection")
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the answer that closes it, the connection gave %v %v, want EOF", n, err)
	}
	select {
	case <-st.APIExited():
		t.Logf("FIGURES the API exited %v after its last connection closed (DRAIN_TIME %v)", time.Since(closedAt).Round(time.Millisecond), drain)
	case <-time.After(drain / 2):
		t.Errorf("the API still runs %v after its last connection closed; the drain should end with it", drain/2)
	}
}
