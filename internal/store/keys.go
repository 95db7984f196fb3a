package store

// Every Redis key and channel that puzzleq itself uses is built here, and
// only here, so the whole keyspace can be read in one screen. Asynq's own
// keys ("asynq:{queue}:...") are asynq's business.
//
// All keys share a prefix (default "pq:") so tests can run side by side on
// one Redis and operators can find our data with SCAN pq:*.

// keys builds key names under one prefix.
type keys struct{ prefix string }

// task is a hash holding one task record.
func (k keys) task(id string) string { return k.prefix + "task:" + id }

// batch is a hash holding a batch's total and per-state counts.
func (k keys) batch(id string) string { return k.prefix + "batch:" + id }

// batchItems is a list of a batch's task IDs in submission order.
func (k keys) batchItems(id string) string { return k.prefix + "batch:" + id + ":items" }

// outbox is a hash of the queued tasks of a batch that are not yet known
// to be on the queue: field = the unit's position in the batch, value =
// the tasks.Unit (its MarshalBinary form). It is written with the batch's records and
// emptied as the units are enqueued.
func (k keys) outbox(batchID string) string { return k.prefix + "outbox:" + batchID }

// outboxIndex is a sorted set of the batches that have an outbox, scored
// by creation time in Unix milliseconds, so the reconciler finds the
// enqueues a crash interrupted without scanning.
func (k keys) outboxIndex() string { return k.prefix + "outbox" }

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
func (k keys) ownerPending(owner string) string { return k.prefix + "owner:" + owner + ":pending" }

// ownerOpen is a hash of how many tasks have not ended per unit of an API
// key's work: field = a batch ID, or a single task's ID.
func (k keys) ownerOpen(owner string) string { return k.prefix + "owner:" + owner + ":open" }

// ownerExpiry is a sorted set of the same units scored by the Unix
// millisecond at which their records expire, so that the count drops when
// unfinished records expire rather than never.
func (k keys) ownerExpiry(owner string) string { return k.prefix + "owner:" + owner + ":expiry" }

// owner returns the three quota keys of an owner, in the order the
// scripts take them: pending, open, expiry.
func (k keys) owner(owner string) []string {
	return []string{k.ownerPending(owner), k.ownerOpen(owner), k.ownerExpiry(owner)}
}

// rateLimit is the token bucket of an API key. redis_rate puts its own
// "rate:" in front of it.
func (k keys) rateLimit(owner string) string { return k.prefix + "owner:" + owner }

// events is the pub/sub channel on which every terminal task transition
// and every finished batch is announced, for long polls.
func (k keys) events() string { return k.prefix + "events" }

// cancels is the pub/sub channel on which cancellations of running tasks
// are announced, for workers.
func (k keys) cancels() string { return k.prefix + "cancels" }
