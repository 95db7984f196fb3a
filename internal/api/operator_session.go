package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
)

// OperatorCookie is the cookie that carries an operator's browser session
// on the operator routes: a browser cannot send a bearer header to the
// dashboard's pages, so an operator signs in once (OperatorLogin) with
// the key and the browser sends this cookie instead.
const OperatorCookie = "pq_operator"

// OperatorSessionTTL is how long a sign-in lasts.
const OperatorSessionTTL = 12 * time.Hour

// OperatorAuth is what Mount gets to guard the operator routes.
type OperatorAuth struct {
	// Check admits an operator (bearer key or session cookie) and takes
	// from its rate; see Server.Operator.
	Check gin.HandlerFunc
	// Login makes the handler of a sign-in form's POST (field "key") for
	// the operator paths under path; see Server.OperatorLogin.
	Login func(path string) gin.HandlerFunc
}

// session is a signed cookie value: base64url(name).expiry.base64url(mac),
// the MAC an HMAC-SHA256 under the operator's own key. It holds no
// secret, any replica with the same keys accepts it, and it dies with the
// key: removing or changing an operator key signs its sessions out.
func session(k *keyEntry, expiry int64) string {
	name := base64.RawURLEncoding.EncodeToString([]byte(k.Name))
	exp := strconv.FormatInt(expiry, 10)
	return name + "." + exp + "." + base64.RawURLEncoding.EncodeToString(sessionMAC(k, name, exp))
}

func sessionMAC(k *keyEntry, name, exp string) []byte {
	m := hmac.New(sha256.New, []byte(k.Key))
	m.Write([]byte("puzzleq operator session\x00" + name + "\x00" + exp))
	return m.Sum(nil)
}

// checkSession returns the operator whose valid, unexpired session v is.
func (s *Server) checkSession(v string, now time.Time) *keyEntry {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return nil
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return nil
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return nil
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil
	}
	for i := range s.keys {
		k := &s.keys[i]
		if k.IsOperator() && k.Name == string(name) && hmac.Equal(mac, sessionMAC(k, parts[0], parts[1])) {
			return k
		}
	}
	return nil
}

// operatorFromCookie admits a request without an Authorization header by
// its session cookie. It reports handled when it answered (a forged or
// expired cookie is a failed authentication) or found the operator.
func (s *Server) operatorFromCookie(c *gin.Context) (k *keyEntry, handled bool) {
	if c.GetHeader("Authorization") != "" {
		return nil, false
	}
	v, err := c.Cookie(OperatorCookie)
	if err != nil || v == "" {
		return nil, false
	}
	addr := c.RemoteIP()
	if wait, blocked := s.failures.blocked(addr, time.Now()); blocked {
		s.tooManyFailures(c, wait)
		return nil, true
	}
	if k = s.checkSession(v, time.Now()); k != nil {
		return k, true
	}
	s.authFailed(c, addr, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "",
		"the operator session has expired or is not valid; sign in again"))
	return nil, true
}

// OperatorLogin signs an operator in from a form (field "key", POSTed as
// application/x-www-form-urlencoded): it sets OperatorCookie, HttpOnly,
// SameSite=Strict, on cookiePath (the dashboard's), and redirects (303)
// there. A wrong key is a failed
// authentication (401, and limited per address); a tenant key is 403.
func (s *Server) OperatorLogin(cookiePath string) gin.HandlerFunc {
	return func(c *gin.Context) {
		addr := c.RemoteIP()
		if wait, blocked := s.failures.blocked(addr, time.Now()); blocked {
			s.tooManyFailures(c, wait)
			return
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, 4<<10)
		tok := c.PostForm("key")
		d := sha256.Sum256([]byte(tok))
		var found *keyEntry
		for i := range s.keys {
			if subtle.ConstantTimeCompare(d[:], s.keys[i].digest[:]) == 1 {
				found = &s.keys[i]
			}
		}
		switch {
		case len(s.keys) == 0:
			fail(c, newError(http.StatusNotFound, apitype.CodeNotFound, "", "no keys are configured; the dashboard needs no sign-in"))
			return
		case found == nil:
			s.authFailed(c, addr, newError(http.StatusUnauthorized, apitype.CodeUnauthorized, "key", "unknown operator key"))
			return
		case !found.IsOperator():
			fail(c, newError(http.StatusForbidden, apitype.CodeForbidden, "key", "this is a tenant key; the dashboard needs an operator key"))
			return
		}
		exp := time.Now().Add(OperatorSessionTTL)
		secure := c.Request.TLS != nil || c.GetHeader("X-Forwarded-Proto") == "https"
		http.SetCookie(c.Writer, &http.Cookie{Name: OperatorCookie, Value: session(found, exp.Unix()), Path: cookiePath,
			Expires: exp, MaxAge: int(OperatorSessionTTL.Seconds()), HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode})
		s.log.InfoContext(c, "operator signed in", "operator", found.Name, "client_addr", addr)
		c.Redirect(http.StatusSeeOther, cookiePath)
	}
}
