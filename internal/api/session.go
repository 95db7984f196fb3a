package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
)

// The dashboard (internal/ui) signs in by exchanging an API key for a
// session cookie, since a browser cannot attach a bearer header to a
// download link or an EventSource. The cookie holds only a random token;
// Redis holds, under the token's digest and for SessionTTL, the digest of
// the key it was opened with, so removing or rotating a key ends its
// sessions at the next request.
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
	CreateSession(ctx context.Context, tokenDigest, keyDigest string, ttl time.Duration) error
	Session(ctx context.Context, tokenDigest string) (string, error)
	DeleteSession(ctx context.Context, tokenDigest string) error
}

// SessionInfo is the answer of GET, POST and DELETE /ui/session.
type SessionInfo struct {
	// Auth is true when API keys are configured, so the dashboard needs a
	// sign-in; false means every caller is the anonymous owner.
	Auth bool `json:"auth"`
	// Name is the signed-in key's name; "" when no one is signed in.
	Name string `json:"name"`
	// ExpiresAt is when the session ends; null when none is open.
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

// sessionKey returns the key of the session the request's cookie names;
// nil, nil when the cookie is absent or names no live session (expired,
// signed out, or its key removed).
func (s *Server) sessionKey(c *gin.Context) (*keyEntry, error) {
	tok, err := c.Cookie(SessionCookie)
	if err != nil || tok == "" || len(tok) > 128 {
		return nil, nil
	}
	v, err := s.store.Session(c.Request.Context(), tokenDigest(tok))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var d [sha256.Size]byte
	if b, err := hex.DecodeString(v); err != nil || len(b) != sha256.Size {
		return nil, nil
	} else {
		copy(d[:], b)
	}
	if k := s.matchKey(d); k != nil && !k.IsOperator() {
		return k, nil
	}
	return nil, nil
}

// cookieAuth authenticates a request without an Authorization header by
// its session cookie, for Authenticate. It reports whether it handled the
// request: authenticated it (a state-changing one only past checkCSRF)
// and ran the rest of the chain, or answered it with an error. False
// means there is no live session, and Authenticate answers as without.
func (s *Server) cookieAuth(c *gin.Context) bool {
	k, err := s.sessionKey(c)
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
		k, err := s.sessionKey(c)
		if err != nil {
			fail(c, err)
			return
		}
		if k != nil {
			info.Name = k.Name
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
	var in signIn
	if err := decodeStrict(http.MaxBytesReader(c.Writer, c.Request.Body, 4<<10), &in); err != nil {
		fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "", "the body must be {\"key\": \"<API key>\"}: %v", err))
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
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	ttl := s.opts.SessionTTL
	if err := s.store.CreateSession(c.Request.Context(), tokenDigest(tok), hex.EncodeToString(d[:]), ttl); err != nil {
		fail(c, err)
		return
	}
	s.setCookie(c, tok, int(ttl/time.Second))
	exp := time.Now().Add(ttl).UTC()
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, SessionInfo{Auth: true, Name: k.Name, ExpiresAt: &exp})
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

// decodeStrict decodes one JSON value from r into v, refusing unknown
// fields and anything after the value, as the API's other JSON bodies do.
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}
