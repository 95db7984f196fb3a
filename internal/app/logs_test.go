package app_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// JSON log lines name each key once, at every depth: the embedded
// worker's lines, and asynq's inside it, must not repeat a key the API's
// logger carries (readers disagree on which duplicate wins).
func TestEmbeddedJSONLogsHaveNoDuplicateKeys(t *testing.T) {
	t.Parallel()
	logs := stacktest.Logs(t)
	st := stacktest.Start(t, stacktest.Options{
		Env:    map[string]string{"REDIS_URL": "", "LOG_FORMAT": "json", "LOG_LEVEL": "debug"},
		LogOut: logs,
	})
	if code, b := st.Do("POST", "/v1/tasks?wait=10s", sample8); code != http.StatusOK {
		t.Fatalf("solve: %d %s", code, b)
	}
	st.Close() // the shutdown lines too
	lines, nested := 0, 0
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		lines++
		if err := uniqueKeys(json.NewDecoder(bytes.NewReader(sc.Bytes()))); err != nil {
			t.Errorf("%v in %s", err, sc.Text())
		}
		if strings.Contains(sc.Text(), `"worker":{"worker_id":"w-`) && strings.Contains(sc.Text(), `"library":"asynq"`) {
			nested++
		}
	}
	if lines == 0 || nested == 0 {
		t.Fatalf("%d log lines, %d from the embedded worker's asynq: nothing was checked\n%s", lines, nested, logs.String())
	}
}

// uniqueKeys reads one JSON value and reports a key repeated in an object.
func uniqueKeys(d *json.Decoder) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			if seen[key] {
				return fmt.Errorf("key %q repeated", key)
			}
			seen[key] = true
			if err := uniqueKeys(d); err != nil {
				return err
			}
		}
		_, err = d.Token()
		return err
	case json.Delim('['):
		for d.More() {
			if err := uniqueKeys(d); err != nil {
				return err
			}
		}
		_, err = d.Token()
		return err
	}
	return nil
}
