package tracing

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// RedisHook returns a go-redis hook that spans each command (a script's
// EVALSHA among them) and each pipeline run inside a recorded span, as
// a client span named "redis <COMMAND>" or "redis pipeline". Commands
// outside a trace get no span: asynq polls its queues and the
// heartbeats, history and watchdogs write many times a second, and
// redisotel's hook would make each of those a trace of its own.
func RedisHook(tr trace.Tracer, addr string) redis.Hook {
	h := redisHook{tr: tr}
	if host, port, err := net.SplitHostPort(addr); err == nil {
		h.attrs = append(h.attrs, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			h.attrs = append(h.attrs, attribute.Int("server.port", p))
		}
	}
	h.attrs = append(h.attrs, attribute.String("db.system.name", "redis"))
	return h
}

type redisHook struct {
	tr    trace.Tracer
	attrs []attribute.KeyValue
}

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmd)
		}
		name := strings.ToUpper(cmd.FullName())
		ctx, span := h.tr.Start(ctx, "redis "+name, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(h.attrs...), trace.WithAttributes(attribute.String("db.operation.name", name)))
		err := next(ctx, cmd)
		end(span, err)
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmds)
		}
		ctx, span := h.tr.Start(ctx, "redis pipeline", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(h.attrs...), trace.WithAttributes(attribute.Int("db.operation.batch.size", len(cmds))))
		err := next(ctx, cmds)
		end(span, err)
		return err
	}
}

// end ends a Redis span, marking it failed for an error other than a
// missing key (redis.Nil), which is an answer.
func end(span trace.Span, err error) {
	if err != nil && !errors.Is(err, redis.Nil) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
