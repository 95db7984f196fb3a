package api

// The per-key limits, each answered 429 with a message that names the
// setting that answered (TestEvery429NamesItsLimit holds them to it):
//
//   - RATE_LIMIT_PER_SECOND and RATE_LIMIT_BURST: requests per second per
//     key (Server.rateLimit, auth.go; the bucket is store.Allow in
//     ratelimit.go, shared by every replica), code rate_limited.
//   - MAX_PENDING_PER_KEY: unfinished tasks per key (quotaError, auth.go;
//     counted exactly by the store's scripts, quota.go), code
//     quota_exceeded.
//   - MAX_KEY_BYTES_IN_FLIGHT: the key's share of the bytes that requests
//     hold in memory (errKeyShare, admit.go; internal/admission), code
//     rate_limited.
//   - MAX_STREAMS_PER_KEY: event streams open at once per key on one
//     replica (batchEvents, events.go), code rate_limited.
//   - MAX_EXPENSIVE_PER_KEY: expensive solves running at once per key.
//     It answers no 429: the worker parks the key's further expensive
//     runs until a slot frees (internal/worker, gate.go).
//
// Two limits are not per key: AUTH_FAILURES_PER_MINUTE per client address
// (tooManyFailures, auth.go) and OPERATOR_RATE_LIMIT_PER_SECOND per
// operator on /monitoring/ and /metrics (auth.go), both rate_limited.
