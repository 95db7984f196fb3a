package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// The dashboard (internal/ui) signs in by exchanging an API key for a
// session cookie, since a browser cannot attach a bearer header to a
// download link or an EventSource. The cookie holds only a random token;
// Redis holds, under the token's digest and for SessionTTL, the digest of
// the key it was opened with, the key's name and when the session was
// opened, so removing, renaming or rotating a key ends its sessions at
// the next request. A session is bound to its key's life too: an API
// started without a key ends that key's sessions and its epoch
// (store.SessionKeys), and a session opened before its key's epoch is
// refused, so a key removed and added back does not revive an old cookie.
//
// Sign-ins are bounded, each bound kept in Redis so that replicas share
// it: SignInsPerKeyPerMinute per key, SignInsPerAddrPerMinute per client
// address, and at most SessionsPerKey live sessions per key, the oldest
// ended first, so that no caller can fill Redis (which runs noeviction)
// with sessions.
//
// CSRF: the cookie is SameSite=Strict, so no cross-site request carries
// it; on top of that every state-changing request authenticated by the
// cookie (and the sign-in and sign-out themselves) must carry the
// UIHeader, which a cross-origin page cannot add without a CORS preflight
// that this server never grants, and must not be marked cross-site by the
// browser's Sec-Fetch-Site. Bearer requests are unaffected: a browser
// never adds that header on its own.

// SessionCookie is the dashboard's session cookie.
const SessionCookie = "puzzleq_session"

// UIHeader is the header the dashboard sends on every request, and that
// state-changing requests authenticated by the session cookie need.
const UIHeader = "X-Puzzleq-UI"

// SessionPath is the dashboard's sign-in resource: GET says who is signed
// in, POST signs in, DELETE signs out.
const SessionPath = "/ui/session"

// SessionStore keeps dashboard sessions; *store.Store satisfies it.
type SessionStore interface {
	CreateSession(ctx context.Context, tokenDigest, keyDigest, keyName string, ttl time.Duration, maxPerKey int) (store.Session, error)
	Session(ctx context.Context, tokenDigest string) (store.Session, error)
	DeleteSession(ctx context.Context, tokenDigest string) error
	SessionKeys(ctx context.Context, keyDigests []string) (map[string]time.Time, error)
	AllowSignIn(ctx context.Context, who string, perMinute int) (bool, time.Duration, error)
}

// sessionEpochs is when each tenant key was first configured for sessions
// (store.SessionKeys), loaded from Redis once per process: by Run at
// start, or by the first request that needs it if Redis was not there.
type sessionEpochs struct {
	mu     sync.Mutex
	epochs map[[sha256.Size]byte]time.Time // nil until loaded
}

// LoadSessionKeys records the configured tenant keys as the ones that may
// hold dashboard sessions, ending the sessions of every other key that
// had any, and loads their epochs. It is done once; later calls return
// at once.
func (s *Server) LoadSessionKeys(ctx context.Context) error {
	_, err := s.epochs(ctx)
	return err
}

// epochs returns the tenant keys' epochs, loading them on first use.
func (s *Server) epochs(ctx context.Context) (map[[sha256.Size]byte]time.Time, error) {
	s.sessEpochs.mu.Lock()
	defer s.sessEpochs.mu.Unlock()
	if s.sessEpochs.epochs != nil || !s.tenantAuth {
		return s.sessEpochs.epochs, nil
	}
	var digests []string
	for _, k := range s.keys {
		if !k.IsOperator() {
			digests = append(digests, hex.EncodeToString(k.digest[:]))
		}
	}
	got, err := s.store.SessionKeys(ctx, digests)
	if err != nil {
		return nil, err
	}
	m := make(map[[sha256.Size]byte]time.Time, len(got))
	for _, k := range s.keys {
		if e, ok := got[hex.EncodeToString(k.digest[:])]; ok {
			m[k.digest] = e
		}
	}
	s.sessEpochs.epochs = m
	return m, nil
}

// SessionInfo is the answer of GET, POST and DELETE /ui/session.
type SessionInfo struct {
	// Auth is true when API keys are configured, so the dashboard needs a
	// sign-in; false means every caller is the anonymous owner.
	Auth bool `json:"auth"`
	// Name is the signed-in key's name; "" when no one is signed in.
	Name string `json:"name"`
	// ExpiresAt is when the session ends; null when no one is signed in.
	ExpiresAt *time.Time `json:"expires_at"`
}

// signIn is the body of POST /ui/session.
type signIn struct {
	Key string `json:"key"`
}

// tokenDigest is the hex SHA-256 of a session token: the name under which
// Redis keeps the session.
func tokenDigest(tok string) string {
	d := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(d[:])
}

// matchKey returns the configured key whose digest is d, comparing against
// every key in constant time as Authenticate does; nil when none matches.
func (s *Server) matchKey(d [sha256.Size]byte) *keyEntry {
	var found *keyEntry
	for i := range s.keys {
		if subtle.ConstantTimeCompare(d[:], s.keys[i].digest[:]) == 1 {
			found = &s.keys[i]
		}
	}
	return found
}

// sessionKey returns the key of the session the request's cookie names,
// and the session; nil when the cookie is absent or names no live
// session (expired, signed out, ended past its key's cap, or its key
// removed, renamed or removed and added back since).
func (s *Server) sessionKey(c *gin.Context) (*keyEntry, *store.Session, error) {
	tok, err := c.Cookie(SessionCookie)
	if err != nil || tok == "" || len(tok) > 128 {
		return nil, nil, nil
	}
	ctx := c.Request.Context()
	ss, err := s.store.Session(ctx, tokenDigest(tok))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var d [sha256.Size]byte
	if b, err := hex.DecodeString(ss.KeyDigest); err != nil || len(b) != sha256.Size {
		return nil, nil, nil
	} else {
		copy(d[:], b)
	}
	k := s.matchKey(d)
	if k == nil || k.IsOperator() || k.Name != ss.KeyName {
		return nil, nil, nil
	}
	epochs, err := s.epochs(ctx)
	if err != nil {
		return nil, nil, err
	}
	if e, ok := epochs[k.digest]; !ok || ss.Created.Before(e) {
		return nil, nil, nil
	}
	return k, &ss, nil
}

// cookieAuth authenticates a request without an Authorization header by
// its session cookie, for Authenticate. It reports whether it handled the
// request: authenticated it (a state-changing one only past checkCSRF)
// and ran the rest of the chain, or answered it with an error. False
// means there is no live session, and Authenticate answers as without.
func (s *Server) cookieAuth(c *gin.Context) bool {
	k, _, err := s.sessionKey(c)
	if err != nil {
		fail(c, err)
		return true
	}
	if k == nil {
		return false
	}
	if !safeMethod(c.Request.Method) {
		if err := checkCSRF(c); err != nil {
			fail(c, err)
			return true
		}
	}
	c.Set(ctxOwner, k.Name)
	c.Set(ctxKey, k)
	c.Next()
	return true
}

// safeMethod reports whether a request of method m changes nothing.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkCSRF refuses a request that a page of another site could have
// made: one without the UIHeader, or one the browser marks as cross-site
// or same-site-but-other-origin.
func checkCSRF(c *gin.Context) error {
	if c.GetHeader(UIHeader) == "" {
		return newError(http.StatusForbidden, apitype.CodeForbidden, UIHeader,
			"a request authenticated by the dashboard's session cookie that changes state needs the %s header", UIHeader)
	}
	if site := c.GetHeader("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return newError(http.StatusForbidden, apitype.CodeForbidden, "Sec-Fetch-Site",
			"cross-origin requests may not use the dashboard's session cookie")
	}
	return nil
}

// getSession answers who is signed in.
func (s *Server) getSession(c *gin.Context) {
	info := SessionInfo{Auth: s.tenantAuth}
	if info.Auth {
		k, ss, err := s.sessionKey(c)
		if err != nil {
			fail(c, err)
			return
		}
		if k != nil {
			info.Name = k.Name
			exp := ss.Expires.UTC()
			info.ExpiresAt = &exp
		}
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, info)
}

// createSession exchanges an API key for a session cookie. A wrong key
// gets the same 401 as a wrong bearer key.
func (s *Server) createSession(c *gin.Context) {
	if err := checkCSRF(c); err != nil {
		fail(c, err)
		return
	}
	if !s.tenantAuth {
		fail(c, newError(http.StatusConflict, apitype.CodeConflict, "", "API keys are not configured: the dashboard needs no sign-in"))
		return
	}
	addr := c.RemoteIP()
	if wait, blocked := s.failures.blocked(addr, time.Now()); blocked {
		s.tooManyFailures(c, wait)
		return
	}
	ctx := c.Request.Context()
	if !s.allowSignIn(c, "addr:"+addr, s.opts.SignInsPerAddrPerMinute, errSignInsOfAddr) {
		return
	}
	var in signIn
	if err := s.decodeSignIn(c, &in); err != nil {
		fail(c, err)
		return
	}
	if in.Key == "" {
		fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "key", "key is required"))
		return
	}
	d := sha256.Sum256([]byte(in.Key))
	k := s.matchKey(d)
	if k == nil {
		// Limited per address like a wrong bearer key (authFailed).
		s.authFailed(c, addr, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "key", "unknown API key"))
		return
	}
	if k.IsOperator() {
		fail(c, newError(http.StatusForbidden, apitype.CodeForbidden, "key",
			"this is an operator key, which /v1 refuses; sign in here with a tenant key, or at /monitoring/login as an operator"))
		return
	}
	keyHex := hex.EncodeToString(d[:])
	if !s.allowSignIn(c, "key:"+keyHex, s.opts.SignInsPerKeyPerMinute, errSignInsOfKey) {
		return
	}
	if _, err := s.epochs(ctx); err != nil {
		fail(c, err)
		return
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	ttl := s.opts.SessionTTL
	ss, err := s.store.CreateSession(ctx, tokenDigest(tok), keyHex, k.Name, ttl, s.opts.SessionsPerKey)
	if err != nil {
		fail(c, err)
		return
	}
	s.setCookie(c, tok, int(ttl/time.Second))
	exp := ss.Expires.UTC()
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, SessionInfo{Auth: true, Name: k.Name, ExpiresAt: &exp})
}

// The refusals of a sign-in over its key's or its address's limit.
var (
	errSignInsOfKey = newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
		"too many dashboard sign-ins with this key (SIGN_INS_PER_KEY_PER_MINUTE); retry later")
	errSignInsOfAddr = newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
		"too many dashboard sign-ins from this address (SIGN_INS_PER_ADDR_PER_MINUTE); retry later")
)

// allowSignIn counts a sign-in against who's bucket of perMinute and
// answers refused (429) with Retry-After, reporting false, when it is
// over.
func (s *Server) allowSignIn(c *gin.Context, who string, perMinute int, refused *apiError) bool {
	ok, wait, err := s.store.AllowSignIn(c.Request.Context(), who, perMinute)
	if err != nil {
		fail(c, err)
		return false
	}
	if !ok {
		c.Header("Retry-After", retryAfter(wait))
		fail(c, refused)
		return false
	}
	return true
}

// maxSignInBody bounds the sign-in body: a key and its JSON around it.
const maxSignInBody = 4 << 10

// decodeSignIn reads the sign-in body under the rules of every /v1 body
// (puzzle.DecodeStrict: exact names, no duplicate or unknown ones, valid
// UTF-8, one value), so that {"KEY": ...} is refused as /v1 refuses it.
func (s *Server) decodeSignIn(c *gin.Context, in *signIn) error {
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxSignInBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "", "could not read the request body")
	}
	return puzzle.DecodeStrict(body, in)
}

// deleteSession signs out: the session ends in Redis, so a copy of the
// cookie is worthless too, and the browser is told to drop it.
func (s *Server) deleteSession(c *gin.Context) {
	if err := checkCSRF(c); err != nil {
		fail(c, err)
		return
	}
	if tok, err := c.Cookie(SessionCookie); err == nil && tok != "" && len(tok) <= 128 {
		if err := s.store.DeleteSession(c.Request.Context(), tokenDigest(tok)); err != nil {
			fail(c, err)
			return
		}
	}
	s.setCookie(c, "", -1)
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, SessionInfo{Auth: s.tenantAuth})
}

// setCookie sets (maxAge > 0) or clears (maxAge < 0) the session cookie:
// HttpOnly so no script reads it, SameSite=Strict so no other site's
// request carries it, Path=/ because the API's routes and the dashboard
// share it, and Secure when the request came over TLS (directly or, as a
// proxy's X-Forwarded-Proto says, to the proxy).
func (s *Server) setCookie(c *gin.Context, tok string, maxAge int) {
	secure := c.Request.TLS != nil || strings.EqualFold(c.GetHeader("X-Forwarded-Proto"), "https")
	http.SetCookie(c.Writer, &http.Cookie{Name: SessionCookie, Value: tok, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode})
}
