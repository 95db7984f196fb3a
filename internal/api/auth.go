package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
)

// APIKey is one client's credentials and limits. Zero limits take the
// server's defaults.
type APIKey struct {
	Name          string `json:"name"`
	Key           string `json:"key"`
	RatePerSecond int    `json:"rate_per_second,omitempty"`
	Burst         int    `json:"burst,omitempty"`
	MaxPending    int    `json:"max_pending,omitempty"`
	// Weight is the key's weight in the share of solver slots between
	// the keys with expensive work (0 means 1): a key of weight 3 gets
	// three times the slots of a key of weight 1 while both wait.
	Weight int `json:"weight,omitempty"`
	// Role is RoleTenant ("" too) or RoleOperator. The two are disjoint:
	// a tenant key opens /v1 only, an operator key the operator routes
	// only, so a leaked tenant key never shows the queue dashboard (every
	// owner's payloads, Redis INFO) and the operator's key is never sent
	// by client programs.
	Role string `json:"role,omitempty"`
}

// The roles of an API key.
const (
	// RoleTenant keys use /v1 and own what they create.
	RoleTenant = "tenant"
	// RoleOperator keys open the operator routes: the /monitoring/
	// dashboard and /metrics.
	RoleOperator = "operator"
)

// IsOperator reports whether the key has the operator role.
func (k APIKey) IsOperator() bool { return k.Role == RoleOperator }

type keyEntry struct {
	APIKey
	digest [sha256.Size]byte
}

const ctxKey = "puzzleq.key"

// Authenticate identifies the caller of /v1 by its bearer key when tenant
// keys are configured; with none configured every caller is the anonymous
// owner "". Without an Authorization header the dashboard's session
// cookie may stand in for the key (cookieAuth). Keys are compared as
// SHA-256 digests, in constant time, against every configured key, so
// neither a key's bytes nor which key matched leak through timing. Keys are never logged. An operator key is
// refused (403): the roles are disjoint. Failed attempts are limited per
// client address (see authFailed).
func (s *Server) Authenticate() gin.HandlerFunc {
	return func(c *gin.Context) {
		if !s.tenantAuth {
			c.Next()
			return
		}
		if c.GetHeader("Authorization") == "" && s.cookieAuth(c) {
			return // the dashboard's session cookie (session.go)
		}
		found, ok := s.identify(c, "missing bearer API key: send Authorization: Bearer <key>")
		if !ok {
			return
		}
		if found.IsOperator() {
			fail(c, newError(http.StatusForbidden, apitype.CodeForbidden, "",
				"operator keys open /monitoring/ and /metrics only; /v1 needs a tenant key"))
			return
		}
		c.Set(ctxOwner, found.Name)
		c.Set(ctxKey, found)
		c.Next()
	}
}

// Operator guards the operator routes (/monitoring/, /metrics on the main
// listener). With any key configured (tenant or operator) they need an
// operator key: a tenant key is refused (403), so with API_KEYS set and
// no OPERATOR_KEYS they are closed to everyone. With no key at all auth
// is off and they are open, as /v1 is. Either way each operator (or,
// anonymous, each client address) has a token bucket of its own, apart
// from the tenants', so no caller can flood the dashboard's Redis scans.
func (s *Server) Operator() gin.HandlerFunc {
	return func(c *gin.Context) {
		who := "addr:" + c.RemoteIP()
		if len(s.keys) > 0 {
			found, handled := s.operatorFromCookie(c)
			if handled && found == nil {
				return
			}
			if !handled {
				var ok bool
				if found, ok = s.identify(c, "missing operator key: send Authorization: Bearer <operator key>, or sign in at /monitoring/login"); !ok {
					return
				}
			}
			if !found.IsOperator() {
				fail(c, newError(http.StatusForbidden, apitype.CodeForbidden, "",
					"this route needs an operator key (OPERATOR_KEYS, or role operator in API_KEYS_FILE); tenant keys are refused"))
				return
			}
			who = "key:" + found.Name
		}
		rate, burst := s.opts.OperatorRatePerSecond, max(s.opts.OperatorBurst, 1)
		allowed, retry, err := s.store.AllowOperator(c.Request.Context(), who, rate, burst)
		if err != nil {
			fail(c, err)
			return
		}
		if !allowed {
			c.Header("Retry-After", retryAfter(retry))
			fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
				"operator rate limit of %d requests per second exceeded (OPERATOR_RATE_LIMIT_PER_SECOND)", rate))
			return
		}
		c.Next()
	}
}

// identify finds the configured key the request's bearer token is. When
// it is not one, or the client's address is over its failed-attempt
// limit, it answers (401 or 429) and reports false.
func (s *Server) identify(c *gin.Context, missing string) (*keyEntry, bool) {
	addr := c.RemoteIP()
	if wait, blocked := s.failures.blocked(addr, time.Now()); blocked {
		s.tooManyFailures(c, wait)
		return nil, false
	}
	tok, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || tok == "" {
		c.Header("WWW-Authenticate", `Bearer realm="puzzleq"`)
		s.authFailed(c, addr, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "", "%s", missing))
		return nil, false
	}
	d := sha256.Sum256([]byte(tok))
	var found *keyEntry
	for i := range s.keys {
		if subtle.ConstantTimeCompare(d[:], s.keys[i].digest[:]) == 1 {
			found = &s.keys[i]
		}
	}
	if found == nil {
		c.Header("WWW-Authenticate", `Bearer realm="puzzleq", error="invalid_token"`)
		s.authFailed(c, addr, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "", "unknown API key"))
		return nil, false
	}
	return found, true
}

// authFailed answers a failed authentication: 401, or 429 once the
// client's address has failed more than AuthFailuresPerMinute times in a
// minute. The count is kept in Redis, so it holds across replicas; an
// address over it is also remembered here, and then refused everything,
// a valid key too, until its bucket refills: otherwise a guesser would
// learn of a hit by its 200 among the 429s. Without Redis the 401 is
// still the right answer, so a Redis error does not change it.
func (s *Server) authFailed(c *gin.Context, addr string, unauthorized error) {
	ok, retry, err := s.store.AllowAuthFailure(c.Request.Context(), addr, s.opts.AuthFailuresPerMinute)
	if err != nil || ok {
		fail(c, unauthorized)
		return
	}
	retry = max(retry, time.Second)
	s.failures.block(addr, time.Now().Add(retry))
	s.log.WarnContext(c, "authentication failures over the limit; refusing the address", "client_addr", addr,
		"retry_after", retry.String())
	s.tooManyFailures(c, retry)
}

func (s *Server) tooManyFailures(c *gin.Context, wait time.Duration) {
	c.Header("Retry-After", retryAfter(wait))
	fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
		"too many failed authentications from this address (AUTH_FAILURES_PER_MINUTE); retry later"))
}

// retryAfter is a Retry-After value: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(int(math.Ceil(max(d, time.Second).Seconds())))
}

// maxBlocked bounds the addresses a replica remembers as over their
// failure limit; past it, new ones are refused only by the Redis count
// (each failure then costs a Redis call), never forgotten early.
const maxBlocked = 10000

// blocklist is the addresses over their failed-authentication limit, with
// the time each may try again.
type blocklist struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (b *blocklist) blocked(addr string, now time.Time) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.until[addr]
	if !ok {
		return 0, false
	}
	if !now.Before(t) {
		delete(b.until, addr)
		return 0, false
	}
	return t.Sub(now), true
}

func (b *blocklist) block(addr string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	if len(b.until) >= maxBlocked {
		now := time.Now()
		for a, t := range b.until {
			if !now.Before(t) {
				delete(b.until, a)
			}
		}
		if len(b.until) >= maxBlocked {
			return
		}
	}
	b.until[addr] = until
}

// rateLimit takes one token from the caller's bucket in Redis, so the
// limit holds across API replicas. Anonymous callers (auth off) are not
// limited: there is no one to attribute the requests to.
func (s *Server) rateLimit() gin.HandlerFunc {
	return func(c *gin.Context) {
		k, ok := c.Get(ctxKey)
		if !ok {
			c.Next()
			return
		}
		key := k.(*keyEntry)
		rate, burst := s.limitsOf(key)
		allowed, retry, err := s.store.Allow(c.Request.Context(), key.Name, rate, burst)
		if err != nil {
			fail(c, err)
			return
		}
		if !allowed {
			c.Header("Retry-After", retryAfter(retry))
			fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "", "this key's rate limit of %d requests per second exceeded (RATE_LIMIT_PER_SECOND)", rate))
			return
		}
		c.Next()
	}
}

func (s *Server) limitsOf(k *keyEntry) (rate, burst int) {
	rate, burst = s.opts.RatePerSecond, s.opts.RateBurst
	if k.RatePerSecond > 0 {
		rate = k.RatePerSecond
	}
	if k.Burst > 0 {
		burst = k.Burst
	}
	return rate, max(burst, 1)
}

func (s *Server) quotaOf(c *gin.Context) int {
	if k, ok := c.Get(ctxKey); ok && k.(*keyEntry).MaxPending > 0 {
		return k.(*keyEntry).MaxPending
	}
	return s.opts.MaxPendingPerKey
}

// quotaFor is the caller's quota for SubmitTask; 0 (unlimited) when auth
// is off, since anonymous tasks have no owner to count against.
func (s *Server) quotaFor(c *gin.Context) int {
	if ownerOf(c) == "" {
		return 0
	}
	return s.quotaOf(c)
}

func (s *Server) quotaError(c *gin.Context) error {
	c.Header("Retry-After", "5")
	return newError(http.StatusTooManyRequests, apitype.CodeQuotaExceeded, "",
		"this key may have at most %d unfinished tasks (MAX_PENDING_PER_KEY); wait for some to end", s.quotaOf(c))
}

// ownerOf returns the API key name of the caller; "" while auth is off.
func ownerOf(c *gin.Context) string { return c.GetString(ctxOwner) }

const ctxOwner = "puzzleq.owner"
