package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The pipeline floor is the least a single task can cost on this machine
// when it makes the hops that a single task of the service makes, and
// nothing else: a bare net/http server that takes POST /v1/tasks?wait=,
// writes a record and enqueues asynq's message in one Lua round trip,
// and holds the request; a bare asynq server whose handler makes one Lua
// round trip that ends the record, caches the result and publishes the
// event, after which asynq marks the task done; and one subscription that
// hands the event to the held request, which answers. It validates,
// hashes, solves, limits and observes nothing. The throughput scenario
// against it, in the same slices as against the service, says how much of
// a single task's cost is the service's own code and how much is the
// hops themselves, which the comparison with raw asynq cannot
// tell apart (loadgen -scenario throughput,raw-asynq,pipeline-floor).

const (
	pipeDB      = 2 // raw-asynq uses DB 1
	pipeQueue   = "loadgen-pipe"
	pipeChannel = "loadgen-pipe-events"
	pipeResult  = `{"solvable":true,"moves":0,"path":""}`
)

// pipeSubmitScript is the floor's submission: the task's record, and
// asynq's enqueue as its own script does it (the message hash, the
// pending list, the set of queues).
//
// KEYS[1] the record, KEYS[2] asynq's task hash, KEYS[3] its queue's
// pending list, KEYS[4] asynq's set of queues
// ARGV[1] now (Unix ms), ARGV[2] the request, ARGV[3] asynq's message,
// ARGV[4] now (Unix ns), ARGV[5] the task ID, ARGV[6] the queue
var pipeSubmitScript = redis.NewScript(`
redis.call('HSET', KEYS[1], 'kind', 'sliding', 'state', 'pending', 'created_at', ARGV[1], 'request', ARGV[2])
redis.call('EXPIRE', KEYS[1], 3600)
redis.call('HSET', KEYS[2], 'msg', ARGV[3], 'state', 'pending', 'pending_since', ARGV[4])
redis.call('LPUSH', KEYS[3], ARGV[5])
redis.call('SADD', KEYS[4], ARGV[6])
return 1
`)

// pipeFinishScript is the floor's end of a task: the record completed
// with its result, the result cached, and the event that carries it.
//
// KEYS[1] the record, KEYS[2] the cache entry
// ARGV[1] now (Unix ms), ARGV[2] the result, ARGV[3] the channel,
// ARGV[4] the task ID
var pipeFinishScript = redis.NewScript(`
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[2], 'completed_at', ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', 86400000)
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' ' .. ARGV[2])
return 1
`)

// pipeRig runs the pipeline floor inside this process, on loadgen's own
// Redis (DB pipeDB), with as many asynq servers, of the same concurrency
// and check interval, as the stack has workers.
type pipeRig struct {
	url     string
	rdb     *redis.Client
	srv     *http.Server
	servers []*asynq.Server
	stop    context.CancelFunc
	done    sync.WaitGroup
	waiters sync.Map // task ID -> chan string
	parsed  *puzzle.Parsed
	typ     string
}

// pipeBody is the one request every floor client sends: the floor reads
// it and keeps it, but never decodes it.
var pipeBody = []byte(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)

func (lg *loadgen) newPipeRig() (_ *pipeRig, err error) {
	rg := &pipeRig{rdb: redis.NewClient(&redis.Options{Addr: lg.st.Redis.Addr, DB: pipeDB, PoolSize: 4 * lg.o.clients})}
	defer func() {
		if err != nil {
			rg.close()
		}
	}()
	if rg.parsed, err = puzzle.Decode(pipeBody); err != nil {
		return nil, fmt.Errorf("pipeline floor: %w", err)
	}
	if rg.typ, err = tasks.TypeFor(rg.parsed.Kind()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rg.stop = cancel
	ps := rg.rdb.Subscribe(ctx, pipeChannel)
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		ps.Close()
		return nil, fmt.Errorf("pipeline floor: subscribe: %w", err)
	}
	rg.done.Go(func() { rg.listen(ctx, ps) })

	mux := asynq.NewServeMux()
	mux.HandleFunc(rg.typ, rg.process)
	for range lg.o.workers {
		s := asynq.NewServerFromRedisClient(rg.rdb, asynq.Config{
			Concurrency: lg.rep.Concurrency, Queues: map[string]int{pipeQueue: 1}, TaskCheckInterval: lg.o.checkInterval,
			LogLevel: asynq.FatalLevel, ShutdownTimeout: 5 * time.Second,
		})
		if err := s.Start(mux); err != nil {
			return nil, err
		}
		rg.servers = append(rg.servers, s)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := http.NewServeMux()
	h.HandleFunc("POST /v1/tasks", rg.submit)
	rg.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	rg.url = "http://" + l.Addr().String()
	rg.done.Go(func() { _ = rg.srv.Serve(l) })
	return rg, nil
}

// submit records and enqueues the task, then holds the request until the
// task's event arrives (or 30 s pass, as the service's ?wait=30s).
func (rg *pipeRig) submit(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	q, err := asynqdata.Solve(id, "", rg.parsed, pipeQueue, tasks.Limits{Deadline: map[puzzle.Kind]time.Duration{rg.parsed.Kind(): time.Minute}}, time.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	ch := make(chan string, 1)
	rg.waiters.Store(id, ch)
	defer rg.waiters.Delete(id)
	now := time.Now()
	err = pipeSubmitScript.Run(r.Context(), rg.rdb,
		[]string{"pipe:task:" + id, asynqdata.TaskKey(pipeQueue, id), asynqdata.PendingKey(pipeQueue), asynqdata.QueuesKey},
		now.UnixMilli(), body, q.Msg, now.UnixNano(), id, pipeQueue).Err()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	w.Header().Set("Content-Type", "application/json")
	select {
	case res := <-ch:
		fmt.Fprintf(w, `{"id":%q,"kind":"sliding","state":"completed","result":%s}`, id, res)
	case <-t.C:
		fmt.Fprintf(w, `{"id":%q,"kind":"sliding","state":"pending"}`, id)
	case <-r.Context().Done():
	}
}

// process is the floor's task handler: it ends the task in one round
// trip; asynq then marks it done.
func (rg *pipeRig) process(ctx context.Context, _ *asynq.Task) error {
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return errors.New("pipeline floor: no task ID")
	}
	return pipeFinishScript.Run(ctx, rg.rdb, []string{"pipe:task:" + id, "pipe:cache:" + id},
		strconv.FormatInt(time.Now().UnixMilli(), 10), pipeResult, pipeChannel, id).Err()
}

// listen hands each event to the request that waits for it, as the
// service's listener does, reading the subscription in one goroutine.
func (rg *pipeRig) listen(ctx context.Context, ps *redis.PubSub) {
	defer ps.Close()
	for ctx.Err() == nil {
		m, err := ps.ReceiveTimeout(ctx, time.Second)
		if err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				sleepCtx(ctx, 10*time.Millisecond) // go-redis reconnects on the next call
			}
			continue
		}
		msg, ok := m.(*redis.Message)
		if !ok {
			continue
		}
		id, res, _ := strings.Cut(msg.Payload, " ")
		if ch, ok := rg.waiters.Load(id); ok {
			select {
			case ch.(chan string) <- res:
			default:
			}
		}
	}
}

func (rg *pipeRig) close() {
	if rg.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = rg.srv.Shutdown(ctx)
		cancel()
	}
	for _, s := range rg.servers {
		s.Shutdown()
	}
	if rg.stop != nil {
		rg.stop()
	}
	rg.done.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rg.rdb.FlushDB(ctx)
	rg.rdb.Close()
}
