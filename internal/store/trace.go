package store

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The batch record's fields holding the W3C trace context of the request
// that submitted the batch, so that the spans of its units, which run
// long after that request and each in a trace of its own, can link to
// its trace. Written only when the API traces.
const (
	fieldTraceParent = "traceparent"
	fieldTraceState  = "tracestate"
)

// setBatchTraceScript writes the fields on a batch that exists: a batch
// deleted meanwhile is not brought back as a record of two fields
// without a TTL.
var setBatchTraceScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1`)

// SetBatchTrace records the trace context of the request that submitted
// batch id on its record.
func (s *Store) SetBatchTrace(ctx context.Context, id, traceparent, tracestate string) error {
	err := setBatchTraceScript.Run(ctx, s.rdb, []string{s.k.batch(id)},
		fieldTraceParent, traceparent, fieldTraceState, tracestate).Err()
	if err != nil {
		return fmt.Errorf("store: set the trace of batch %s: %w", id, err)
	}
	return nil
}

// BatchTrace returns the trace context SetBatchTrace recorded on batch
// id; "" when there is none.
func (s *Store) BatchTrace(ctx context.Context, id string) (traceparent, tracestate string, err error) {
	v, err := s.rdb.HMGet(ctx, s.k.batch(id), fieldTraceParent, fieldTraceState).Result()
	if err != nil {
		return "", "", fmt.Errorf("store: read the trace of batch %s: %w", id, err)
	}
	traceparent, _ = v[0].(string)
	tracestate, _ = v[1].(string)
	return traceparent, tracestate, nil
}
