package api

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
)

// renderTask answers with one task resource: the bytes encoding/json
// writes for it (c.JSON), without its reflection. Rendering by reflection
// is the largest part of the API's own CPU on a cache hit, the single
// task's hottest path (BenchmarkCacheHitHandler); the task
// resource is also every long poll's answer. TestAppendTaskAsJSON holds
// appendTask to encoding/json's bytes.
func renderTask(c *gin.Context, status int, t *apitype.Task) {
	bp := taskBufs.Get().(*[]byte)
	b, err := appendTask((*bp)[:0], t)
	if err != nil {
		// What encoding/json does with it, error included.
		taskBufs.Put(bp)
		c.JSON(status, t)
		return
	}
	// As gin's JSON render does: the header's value is shared, never
	// written to, so that each answer does not allocate it.
	c.Writer.Header()["Content-Type"] = jsonContentType
	c.Status(status)
	_, _ = c.Writer.Write(b) // a client gone is the server's to notice
	if cap(b) <= maxPooledTaskBuf {
		*bp = b
		taskBufs.Put(bp)
	}
}

// jsonContentType is the Content-Type that c.JSON sends.
var jsonContentType = []string{"application/json; charset=utf-8"}

// maxPooledTaskBuf keeps a task with a large result (a 1000×1000 sweep
// board) from pinning its buffer in the pool.
const maxPooledTaskBuf = 16 << 10

var taskBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// appendTask appends t as encoding/json encodes it: the same members in
// the same order, strings escaped the same way (HTML characters too), the
// result compacted and times in RFC 3339 with nanoseconds. It returns an
// error where encoding/json would (a result that is not JSON, a time
// that RFC 3339 cannot hold).
func appendTask(b []byte, t *apitype.Task) ([]byte, error) {
	var err error
	b = appendJSONString(append(b, `{"id":`...), t.ID)
	b = appendJSONStringPtr(append(b, `,"custom_id":`...), t.CustomID)
	b = appendJSONString(append(b, `,"kind":`...), t.Kind)
	b = appendJSONString(append(b, `,"state":`...), string(t.State))
	if b, err = appendRawJSON(append(b, `,"result":`...), t.Result); err != nil {
		return b, err
	}
	b = append(b, `,"error":`...)
	if t.Error == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(append(b, `{"code":`...), t.Error.Code)
		b = append(appendJSONString(append(b, `,"message":`...), t.Error.Message), '}')
	}
	b = strconv.AppendBool(append(b, `,"cached":`...), t.Cached)
	b = appendJSONStringPtr(append(b, `,"batch_id":`...), t.BatchID)
	for _, m := range [...]struct {
		name string
		at   *time.Time
	}{{`,"created_at":`, t.CreatedAt}, {`,"started_at":`, t.StartedAt}, {`,"completed_at":`, t.CompletedAt}} {
		if b, err = appendJSONTime(append(b, m.name...), m.at); err != nil {
			return b, err
		}
	}
	b = strconv.AppendInt(append(b, `,"attempts":`...), int64(t.Attempts), 10)
	b = append(b, `,"progress":`...)
	if t.Progress == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(append(b, `{"bound":`...), int64(t.Progress.Bound), 10)
		b = append(strconv.AppendInt(append(b, `,"nodes":`...), t.Progress.Nodes, 10), '}')
	}
	b = append(b, `,"webhook":`...)
	if t.Webhook == nil {
		b = append(b, "null"...)
	} else {
		w := t.Webhook
		b = appendJSONString(append(b, `{"url":`...), w.URL)
		b = strconv.AppendInt(append(b, `,"attempts":`...), int64(w.Attempts), 10)
		b = append(b, `,"last_status":`...)
		if w.LastStatus == nil {
			b = append(b, "null"...)
		} else {
			b = strconv.AppendInt(b, int64(*w.LastStatus), 10)
		}
		b = appendJSONStringPtr(append(b, `,"last_error":`...), w.LastError)
		if b, err = appendJSONTime(append(b, `,"last_attempt_at":`...), w.LastAttemptAt); err != nil {
			return b, err
		}
		if b, err = appendJSONTime(append(b, `,"delivered_at":`...), w.DeliveredAt); err != nil {
			return b, err
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSONString appends s quoted as encoding/json quotes it: as
// itself when it is plainJSONString, else by encoding/json.
func appendJSONString(b []byte, s string) []byte {
	if plainJSONString(s) {
		return append(append(append(b, '"'), s...), '"')
	}
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

func appendJSONStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

// appendRawJSON appends a result as encoding/json writes a RawMessage:
// null when nil (an empty one is an error), else compacted with <, >, &, U+2028 and U+2029
// escaped. A result as the solvers write it has none of those and no
// space outside its strings, so it goes as it is once a scan says so.
func appendRawJSON(b []byte, r json.RawMessage) ([]byte, error) {
	if r == nil {
		return append(b, "null"...), nil
	}
	if plainRawJSON(r) {
		return append(b, r...), nil
	}
	out, err := json.Marshal(r)
	if err != nil {
		return b, err
	}
	return append(b, out...), nil
}

// plainRawJSON reports whether encoding/json would write r unchanged:
// ASCII without a byte that compacting removes or escaping rewrites
// (anything else goes through encoding/json, which also rewrites invalid
// UTF-8), and valid JSON: encoding/json fails on anything else.
func plainRawJSON(r []byte) bool {
	for _, c := range r {
		switch c {
		case ' ', '\t', '\r', '\n', '<', '>', '&':
			return false
		}
		if c >= 0x80 {
			return false
		}
	}
	return json.Valid(r)
}

// appendJSONTime appends t as time.Time's MarshalJSON writes it, or null.
func appendJSONTime(b []byte, t *time.Time) ([]byte, error) {
	if t == nil {
		return append(b, "null"...), nil
	}
	if y := t.Year(); y >= 0 && y <= 9999 {
		if _, off := t.Zone(); off == 0 {
			return append(t.AppendFormat(append(b, '"'), time.RFC3339Nano), '"'), nil
		}
	}
	out, err := t.MarshalJSON()
	if err != nil {
		return b, err
	}
	return append(b, out...), nil
}
