package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"math"
	"net/http"
	"strconv"
	"strings"
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
}

type keyEntry struct {
	APIKey
	digest [sha256.Size]byte
}

const ctxKey = "puzzleq.key"

// Authenticate identifies the caller by its bearer key when keys are
// configured, or, without an Authorization header, by the dashboard's
// session cookie (cookieAuth); with none configured every caller is the
// anonymous owner "".
// Keys are compared as SHA-256 digests, in constant time, against every
// configured key, so neither a key's bytes nor which key matched leak
// through timing. Keys are never logged.
func (s *Server) Authenticate() gin.HandlerFunc {
	return func(c *gin.Context) {
		if len(s.keys) == 0 {
			c.Next()
			return
		}
		h := c.GetHeader("Authorization")
		if h == "" && s.cookieAuth(c) {
			return // the dashboard's session cookie (session.go)
		}
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || tok == "" {
			c.Header("WWW-Authenticate", `Bearer realm="puzzleq"`)
			fail(c, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "", "missing bearer API key: send Authorization: Bearer <key>"))
			return
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
			fail(c, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "", "unknown API key"))
			return
		}
		c.Set(ctxOwner, found.Name)
		c.Set(ctxKey, found)
		c.Next()
	}
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
			c.Header("Retry-After", strconv.Itoa(int(math.Ceil(max(retry, time.Second).Seconds()))))
			fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "", "rate limit of %d requests per second exceeded", rate))
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
		"this key may have at most %d unfinished tasks; wait for some to end", s.quotaOf(c))
}
