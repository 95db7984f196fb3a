package store

import "strconv"

// Every Redis key and channel that puzzleq itself uses is built here, and
// only here, so the whole keyspace can be read in one screen. Asynq's own
// keys ("asynq:{queue}:...") are internal/asynqdata's.
//
// All keys share a prefix (default "pq:") so tests can run side by side on
// one Redis and operators can find our data with SCAN pq:*.

// keys builds key names under one prefix.
type keys struct{ prefix string }

// task is a hash holding one task record.
func (k keys) task(id string) string { return k.prefix + "task:" + id }

// taskDeleted is the tombstone of a deleted single task
// (Store.DeleteTask): its owner, kept as long as its record would have
// been (as keys.batchDeleted).
func (k keys) taskDeleted(id string) string { return k.prefix + "task:" + id + ":deleted" }

// batch is a hash holding a batch's total and per-state counts.
func (k keys) batch(id string) string { return k.prefix + "batch:" + id }

// historyMinute is a hash of what ended in one Unix minute, and of the
// tasks not ended at its last sample (history.go). The minute is the
// hash tag, which its flush marks share.
func (k keys) historyMinute(minute int64) string {
	return k.prefix + "history:{" + strconv.FormatInt(minute, 10) + "}"
}

// historyFlush marks that the flush named flush was added to a minute's
// history, so that a retry of it adds nothing.
func (k keys) historyFlush(minute int64, flush string) string {
	return k.historyMinute(minute) + ":flush:" + flush
}

// readiness is a short-lived string the readiness probes write: a Redis
// at maxmemory under noeviction answers PING and refuses every write, so
// only a write tells whether the service can work.
func (k keys) readiness() string { return k.prefix + "readyz" }

// lease is a string naming the process that holds the named lease until
// it expires, so only one API replica at a time runs a background job.
func (k keys) lease(name string) string { return k.prefix + "lease:" + name }

// cache is a string holding the result JSON for a canonical puzzle hash.
func (k keys) cache(hash string) string { return k.prefix + "cache:" + hash }

// idempotency maps an owner's Idempotency-Key to the batch it created.
func (k keys) idempotency(owner, key string) string {
	return k.prefix + "idem:" + owner + ":" + key
}

// ownerPending counts an API key's tasks that have not ended, for the
// per-key quota: the sum of ownerOpen's counts.
func (k keys) ownerPending(owner string) string { return k.prefix + "owner:" + owner + suffixPending }

// ownerOpen is a hash of how many tasks have not ended per unit of an API
// key's work: field = a batch ID, or a single task's ID.
func (k keys) ownerOpen(owner string) string { return k.prefix + "owner:" + owner + suffixOpen }

// ownerExpiry is a sorted set of the same units scored by the Unix
// millisecond at which their records expire, so that the count drops when
// unfinished records expire rather than never.
func (k keys) ownerExpiry(owner string) string { return k.prefix + "owner:" + owner + suffixExpiry }

const (
	suffixPending = ":pending"
	suffixOpen    = ":open"
	suffixExpiry  = ":expiry"
)

// ownerAffixes returns the text around the owner in ownerPending,
// ownerOpen and ownerExpiry (key = before + owner + suffix), for the
// scripts that learn a batch's owner from its record and so cannot be
// handed the keys: they put the owner between these four strings.
func (k keys) ownerAffixes() []any {
	return []any{k.prefix + "owner:", suffixPending, suffixOpen, suffixExpiry}
}

// ownerVT is a string holding the owner's virtual time in the feed: the
// score of the last unit of its last batch (docs/batches.md, Fairness).
// It lives as long as that batch.
func (k keys) ownerVT(owner string) string { return k.prefix + "owner:" + owner + ":vt" }

// ownerBatches is a sorted set of an owner's batch IDs scored by their
// creation time (Unix ms), for GET /v1/batches: the commit adds a batch
// and trims the members older than the record TTL, and the key expires
// with the owner's newest batch, so it holds no more than the records
// that live. An auth-off server's owner is "" (key "owner::batches").
func (k keys) ownerBatches(owner string) string { return k.prefix + "owner:" + owner + ":batches" }

// ownerTasks is the same index of an owner's single tasks, for
// GET /v1/tasks, kept by submitScript, which trims it on one submission
// in 16 (so it may also hold what expired since the owner's last few
// submissions; reads skip and drop those).
func (k keys) ownerTasks(owner string) string { return k.prefix + "owner:" + owner + ":tasks" }

// batchReq is a hash of a batch's requests, custom IDs and kind maps, per
// chunk and per own-unit item (docs/batches.md).
func (k keys) batchReq(id string) string { return k.prefix + "batch:" + id + ":req" }

// batchRetry is the lock a running retry of a batch holds (RetryBatch),
// a string with a TTL, so that retries of one batch run one at a time.
func (k keys) batchRetry(id string) string { return k.prefix + "batch:" + id + ":retry" }

// batchDeleted is the tombstone of a deleted batch (Store.DeleteBatch):
// "<owner> <result chunks>", kept until the batch would have expired, so
// that a repeated delete (a lost answer's retry) is told the batch is
// gone rather than that there never was one, and unlinks what the first
// left.
func (k keys) batchDeleted(id string) string { return k.prefix + "batch:" + id + ":deleted" }

// batchUnits is a list of a batch's units (tasks.UnitRef.Member) not yet
// in the feed: staged with its chunks, so that the commit script and then
// the feed script move them into the feed a window at a time without the
// API passing them.
func (k keys) batchUnits(id string) string { return k.batch(id) + suffixUnits }

const suffixUnits = ":units"

// batchUnitsAffixes returns the text around the batch ID in batchUnits,
// for the feed script, which learns batch IDs from the feed's members.
func (k keys) batchUnitsAffixes() []any { return []any{k.batch(""), suffixUnits} }

// batchRes is a hash of chunk j's ended entries, active markers and
// progress (docs/batches.md).
func (k keys) batchRes(id string, j int) string { return k.batchResBase(id) + strconv.Itoa(j) }

// batchResBase is batchRes without the chunk number, for scripts that
// compute the chunk from the batch's stride and append it.
func (k keys) batchResBase(id string) string { return k.prefix + "batch:" + id + ":res:" }

// feed is a sorted set of the units waiting to be enqueued on the bulk
// queue (the solver slots'), scored by virtual time for fairness between
// owners.
func (k keys) feed() string { return k.prefix + "feed" }

// cheapFeed is feed's twin for the cheap lane: the chunks' shared units
// of cheap items, waiting to be enqueued on tasks.QueueCheapBulk, scored
// on the same virtual time.
func (k keys) cheapFeed() string { return k.prefix + "feed:cheap" }

// feeding is a sorted set of the units taken from feed and being
// enqueued, scored by when they were taken (Unix ms), so the reconciler
// finds the ones whose feeder died.
func (k keys) feeding() string { return k.prefix + "feeding" }

// backlog is a sorted set with one member per backlogUnits units of a
// batch that are not yet fed ("<batch>/b<k>"), scored by the batch's
// expiry in Unix milliseconds. Its cardinality is what KEDA's redis
// scaler reads (deploy/k8s/overlays/prod/scaledobject.yaml): all the
// waiting work, not only the feed's current window.
func (k keys) backlog() string { return k.prefix + "backlog" }

// feedVT is a string holding the score of the last unit taken from feed:
// a new owner's batch starts there, unless all its units are cheap.
func (k keys) feedVT() string { return k.prefix + "feed:vt" }

// cheapFeedVT is feedVT of cheapFeed: a new owner's batch of cheap items
// only starts there.
func (k keys) cheapFeedVT() string { return k.prefix + "feed:cheap:vt" }

// workers is a sorted set of the workers that heartbeat, scored by the
// time each wrote with its last beat (Unix ms, by its own clock): the
// watchdog reads it to notice a worker that stopped (worker.Heartbeat).
func (k keys) workers() string { return k.prefix + "workers" }

// workerHeld is a hash of the asynq tasks a worker runs: field = a run
// token of the worker's, value = tasks.HeldTask as JSON.
func (k keys) workerHeld(worker string) string { return k.prefix + "worker:" + worker + ":held" }

// workerPresence is a worker's worker.Presence as JSON, rewritten by each
// beat with a TTL of a few beats, and removed when it leaves or is
// reaped.
func (k keys) workerPresence(worker string) string {
	return k.prefix + "worker:" + worker + ":presence"
}

// redriven is a sorted set of the asynq tasks the watchdog has queued a
// copy of (member parkedMember(queue, asynq ID), score the Unix ms of the
// copy), so that the original, still listed as active until asynq
// recovers it, is not copied again once no worker's record names it.
func (k keys) redriven() string { return k.prefix + "redriven" }

// owner returns the three quota keys of an owner, in the order the
// scripts take them: pending, open, expiry.
func (k keys) owner(owner string) []string {
	return []string{k.ownerPending(owner), k.ownerOpen(owner), k.ownerExpiry(owner)}
}

// rateLimit is the token bucket of an API key. redis_rate puts its own
// "rate:" in front of it.
func (k keys) rateLimit(owner string) string { return k.prefix + "owner:" + owner }

// solve is a string naming the task whose run is solving an expensive
// puzzle right now (tasks.SolveRun.Solve: its cache key and budget), a
// lease that run renews while it solves, so that an identical submission
// joins it instead of solving again.
func (k keys) solve(key string) string { return k.prefix + "solve:" + key }

// solveWaiters is a hash of the single tasks waiting on an expensive
// puzzle's solve (field = task ID, value = its owner), which the solve's
// end ends together with the same outcome.
func (k keys) solveWaiters(key string) string { return k.solve(key) + suffixWaiters }

const suffixWaiters = ":waiters"

// solveItemLead names the batch item whose run solves the puzzle of key
// (member = its item ID), with the run's lease as its TTL. Batch items
// join it, and a single task's solve (keys.solve), by waiting for it in
// solveParked; single tasks do not join a batch item's run (its end does
// not end their records).
func (k keys) solveItemLead(key string) string { return k.solve(key) + ":item" }

// solveParked is a sorted set of the batch items waiting for an identical
// solve in flight (member = parkedMember), scored by when they first
// waited: the end of that solve moves them all back onto their queue,
// where they find its answer in the cache, or lead a solve of their own
// if it failed or stopped.
func (k keys) solveParked(key string) string { return k.solve(key) + ":parked" }

// solveAffixes returns the text around the solve key in solve and
// solveWaiters, for the cancel script, which learns the key from the
// task record.
func (k keys) solveAffixes() []any { return []any{k.solve(""), suffixWaiters} }

// ownerRunning is a sorted set of an API key's expensive runs holding a
// slot (member = task ID), scored by the Unix millisecond at which their
// lease ends: the per-key cap counts its live members, and a run whose
// worker died drops out when its lease ends.
func (k keys) ownerRunning(owner string) string { return k.prefix + "owner:" + owner + ":running" }

// ownerParked is a sorted set of an API key's expensive runs told to wait
// because its slots were full (member = parkedMember: the asynq task's
// queue and ID), scored by the Unix millisecond it first waited. A run
// that frees a slot moves the longest-waiting of them from asynq's retry
// set back onto its queue at once (promoteLua), so a capped key's work
// goes on as fast as its slots allow rather than at its retry delay.
func (k keys) ownerParked(owner string) string { return k.prefix + "owner:" + owner + ":parked" }

// ownerPromoted is a sorted set of the members of ownerParked that a
// freed slot promoted, scored by the Unix millisecond of the promotion,
// until their admission: one which then takes no slot hands the slot on
// (passLua), and for a SolveLease after its promotion the slot is
// reserved for it, counted as held by its owner (promoteLua).
func (k keys) ownerPromoted(owner string) string { return k.ownerParked(owner) + ":promoted" }

// gateOwners is a sorted set of the API keys with expensive work (member
// = the key's name, score 0): every key holding, reserving or parked for
// a slot is in it, so that the scripts that share the slots (fairLua)
// know whom they share between. A key with none of the three leaves it
// at the next such script.
func (k keys) gateOwners() string { return k.prefix + "gate:owners" }

// gateWeights is a hash of the API keys' weights in the share of slots
// (field = the key's name, value = its weight; 1 when absent), written by
// the API at start from API_KEYS_FILE (Store.SetWeights).
func (k keys) gateWeights() string { return k.prefix + "gate:weights" }

// gateSlots is a hash of the workers' solver slots (field = the worker's
// ID, value = "<solver slots>:<expiry, Unix ms by Redis's clock>"),
// written by each worker at start and with every heartbeat
// (Store.RegisterSlots) and removed when it leaves or is reaped: the
// scripts that share the slots (fairLua) sum its live entries as S.
func (k keys) gateSlots() string { return k.prefix + "gate:slots" }

// parkedMember is a run's member of ownerParked: its asynq queue and task
// ID, tab-separated (neither holds a tab). "" when the run has no asynq
// task (a test's direct call), which is never parked.
func parkedMember(queue, asynqID string) string {
	if queue == "" || asynqID == "" {
		return ""
	}
	return queue + "\t" + asynqID
}

// operatorRate is the token bucket of an operator on the operator routes
// (/monitoring, /metrics): an operator key's name, or a client address
// when auth is off. redis_rate puts its own "rate:" in front of it.
func (k keys) operatorRate(who string) string { return k.prefix + "operator:" + who }

// authFailures is the token bucket of failed authentications from one
// client address. redis_rate puts its own "rate:" in front of it.
func (k keys) authFailures(addr string) string { return k.prefix + "authfail:" + addr }

// session is a string holding a dashboard session (see parseSession):
// the hex SHA-256 of the API key it was opened with, when it was opened
// and when it ends, and the key's name, under the hex SHA-256 of the
// session token (the cookie's value), with the session's TTL. Neither
// the token nor the key is stored, so a read of Redis yields no
// credential.
func (k keys) session(tokenDigest string) string { return k.prefix + "session:" + tokenDigest }

// keySessions is a sorted set of the token digests of one API key's live
// sessions (the key named by its hex SHA-256), scored by when each was
// opened (Unix ms): what caps a key's sessions, oldest ended first.
func (k keys) keySessions(keyDigest string) string { return k.prefix + "sessions:key:" + keyDigest }

// keyEpoch is a string holding when an API key was first configured for
// dashboard sessions (Unix ms, Redis's clock), the key named by its hex
// SHA-256. A session opened before it belongs to an earlier life of the
// key, one that was removed since, and is refused.
func (k keys) keyEpoch(keyDigest string) string { return k.prefix + "sessions:epoch:" + keyDigest }

// sessionKeys is a set of the hex SHA-256 of every API key that has an
// epoch, so that an API started without one of them can end that key's
// sessions and its epoch.
func (k keys) sessionKeys() string { return k.prefix + "sessions:keys" }

// signIns is the token bucket of dashboard sign-ins of one API key ("key:"
// and its digest) or one client address ("addr:" and the address).
// redis_rate puts its own "rate:" in front of it.
func (k keys) signIns(who string) string { return k.prefix + "signin:" + who }

// webhook is a hash holding a completion webhook of one task or batch
// (ref is "b:<batch ID>" or "t:<task ID>", see WebhookRef): its URL and
// what its delivery did so far. It lives as long as the record.
func (k keys) webhook(ref string) string { return k.prefix + "webhook:" + ref }

// webhookWatch is a sorted set of the webhook refs whose task or batch
// had not ended when last looked at, scored by when the webhook was
// recorded (Unix ms). The reconciler enqueues a delivery for each one
// that has ended and only then removes it, so a crash between the end
// and the enqueue cannot lose the delivery.
func (k keys) webhookWatch() string { return k.prefix + "webhooks:watch" }

// webhookBacklog is a sorted set of the webhook refs of one API key whose
// delivery is enqueued and not yet delivered nor given up, scored by when
// it was enqueued (Unix ms): the key's delivery backlog. An auth-off
// server's owner is "".
func (k keys) webhookBacklog(owner string) string { return k.prefix + "webhooks:backlog:" + owner }

// webhookBacklogKeys is the set of API keys that have a webhookBacklog,
// for the metrics to find them.
func (k keys) webhookBacklogKeys() string { return k.prefix + "webhooks:backlog-keys" }

// ackBarrier is a counter that Confirm increments before its WAIT: a write
// of the confirming connection's own, so that the WAIT covers every write
// the master took before it, whichever connection made them.
func (k keys) ackBarrier() string { return k.prefix + "ack" }
