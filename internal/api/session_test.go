package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const (
	aliceUIKey = "alice-ui-s3cret-key-0001"
	bobUIKey   = "bob-ui-t0ken-key-00002"
	opsUIKey   = "ops-ui-operator-key-003"
)

// signInCookie signs in with key and returns the session cookie's value,
// failing the test unless the answer is 200 with a cookie fit for a
// session: HttpOnly, SameSite=Strict, Path=/ and a Max-Age.
func signInCookie(t *testing.T, s *stacktest.Stack, key string) string {
	t.Helper()
	code, b, hdr := s.DoH("POST", api.SessionPath, `{"key":"`+key+`"}`, api.UIHeader, "1")
	if code != 200 {
		t.Fatalf("sign in: %d %s", code, b)
	}
	resp := http.Response{Header: hdr}
	for _, c := range resp.Cookies() {
		if c.Name != api.SessionCookie {
			continue
		}
		if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.MaxAge <= 0 || c.Value == "" {
			t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, a Max-Age", c)
		}
		if strings.Contains(c.Value, key) {
			t.Errorf("the cookie %q holds the key", c.Value)
		}
		return c.Value
	}
	t.Fatalf("sign in set no %s cookie: %v", api.SessionCookie, hdr)
	return ""
}

// asCookie is DoH with the session cookie tok and extra headers.
func asCookie(s *stacktest.Stack, tok, method, path string, body any, header ...string) (int, []byte) {
	code, b, _ := s.DoH(method, path, body, append([]string{"Cookie", api.SessionCookie + "=" + tok}, header...)...)
	return code, b
}

func TestSessionCookieAuth(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{
		"REDIS_URL": r.URL(), "API_KEYS": "alice:" + aliceUIKey + ",bob:" + bobUIKey, "OPERATOR_KEYS": "ops:" + opsUIKey}})
	s.WaitReady()

	// Before sign-in: auth is on and no one is signed in.
	code, b := s.Do("GET", api.SessionPath, nil)
	if info := decode[api.SessionInfo](t, b); code != 200 || !info.Auth || info.Name != "" {
		t.Fatalf("GET session signed out: %d %s", code, b)
	}
	for _, tc := range []struct {
		name, body string
		header     []string
		want       int
		code       string
	}{
		{"no UI header", `{"key":"` + aliceUIKey + `"}`, nil, 403, apitype.CodeForbidden},
		{"cross-site", `{"key":"` + aliceUIKey + `"}`, []string{api.UIHeader, "1", "Sec-Fetch-Site", "cross-site"}, 403, apitype.CodeForbidden},
		{"wrong key", `{"key":"alice-ui-s3cret-key-000"}`, []string{api.UIHeader, "1"}, 401, apitype.CodeUnauthorized},
		{"operator key", `{"key":"` + opsUIKey + `"}`, []string{api.UIHeader, "1"}, 403, apitype.CodeForbidden},
		{"empty key", `{"key":""}`, []string{api.UIHeader, "1"}, 400, apitype.CodeInvalidRequest},
		{"unknown field", `{"key":"x","keys":"y"}`, []string{api.UIHeader, "1"}, 400, apitype.CodeInvalidRequest},
		{"not JSON", `key=x`, []string{api.UIHeader, "1"}, 400, apitype.CodeInvalidRequest},
	} {
		code, b, hdr := s.DoH("POST", api.SessionPath, tc.body, tc.header...)
		if code != tc.want || decode[apitype.ErrorBody](t, b).Error.Code != tc.code || hdr.Get("Set-Cookie") != "" {
			t.Errorf("%s: %d %s (Set-Cookie %q), want %d %s and no cookie", tc.name, code, b, hdr.Get("Set-Cookie"), tc.want, tc.code)
		}
	}

	alice := signInCookie(t, s, aliceUIKey)
	bob := signInCookie(t, s, bobUIKey)
	if code, b := asCookie(s, alice, "GET", api.SessionPath, nil); code != 200 || decode[api.SessionInfo](t, b).Name != "alice" {
		t.Errorf("GET session as alice: %d %s", code, b)
	}
	// Redis holds digests only: neither the key nor the token.
	ctx := context.Background()
	rdb := r.Client(t)
	keys, err := rdb.Keys(ctx, "pq:session:*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("session keys %v %v, want 2", keys, err)
	}
	for _, k := range keys {
		v, _ := rdb.Get(ctx, k).Result()
		ttl, _ := rdb.TTL(ctx, k).Result()
		for _, secret := range []string{aliceUIKey, bobUIKey, alice, bob} {
			if strings.Contains(k+v, secret) {
				t.Errorf("Redis %s = %s holds a credential", k, v)
			}
		}
		if ttl <= 0 {
			t.Errorf("session %s has TTL %v, want one", k, ttl)
		}
	}

	// The cookie authenticates reads; writes need the UI header too.
	batch := `{"tasks":[` + sample8 + `]}`
	if code, b := asCookie(s, alice, "POST", "/v1/batches", batch); code != 403 || decode[apitype.ErrorBody](t, b).Error.Code != apitype.CodeForbidden {
		t.Errorf("cookie POST without the UI header: %d %s, want 403 forbidden", code, b)
	}
	if code, b := asCookie(s, alice, "POST", "/v1/batches", batch, api.UIHeader, "1", "Sec-Fetch-Site", "same-site"); code != 403 {
		t.Errorf("cookie POST from a sibling site: %d %s, want 403", code, b)
	}
	code, b = asCookie(s, alice, "POST", "/v1/batches", batch, api.UIHeader, "1", "Sec-Fetch-Site", "same-origin")
	if code != 202 {
		t.Fatalf("cookie POST with the UI header: %d %s", code, b)
	}
	id := decode[apitype.BatchCreated](t, b).ID
	if code, b := asCookie(s, alice, "GET", "/v1/batches/"+id+"?wait=10s", nil); code != 200 || !decode[apitype.Batch](t, b).Done {
		t.Errorf("cookie GET of her batch: %d %s", code, b)
	}
	// A tenant sees only its own: bob's session gets 404 for alice's batch.
	if code, _ := asCookie(s, bob, "GET", "/v1/batches/"+id, nil); code != 404 {
		t.Errorf("bob's session reads alice's batch: %d, want 404", code)
	}
	// A bearer header wins over the cookie, and needs no UI header.
	if code, _, _ := s.DoAs(bobUIKey, "DELETE", "/v1/batches/"+id, nil, "Cookie", api.SessionCookie+"="+alice); code != 404 {
		t.Errorf("bearer bob with alice's cookie cancels her batch: %d, want 404", code)
	}
	// A made-up cookie is no session.
	if code, _ := asCookie(s, "forged-token", "GET", "/v1/batches/"+id, nil); code != 401 {
		t.Errorf("forged cookie: %d, want 401", code)
	}

	// Sign-out ends the session in Redis: the old cookie no longer works.
	if code, _ := asCookie(s, alice, "DELETE", api.SessionPath, nil); code != 403 {
		t.Errorf("sign-out without the UI header: %d, want 403", code)
	}
	code, b, hdr := s.DoH("DELETE", api.SessionPath, nil, "Cookie", api.SessionCookie+"="+alice, api.UIHeader, "1")
	if code != 200 || !strings.Contains(hdr.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("sign-out: %d %s, Set-Cookie %q", code, b, hdr.Get("Set-Cookie"))
	}
	if code, _ := asCookie(s, alice, "GET", "/v1/batches/"+id, nil); code != 401 {
		t.Errorf("the signed-out cookie still reads: %d, want 401", code)
	}

	// Removing a key ends its sessions: an API on the same Redis without
	// bob's key refuses bob's cookie.
	s2 := stacktest.Start(t, stacktest.Options{Env: map[string]string{"REDIS_URL": r.URL(), "API_KEYS": "alice:" + aliceUIKey}})
	s2.WaitReady()
	if code, _ := asCookie(s, bob, "GET", api.SessionPath, nil); code != 200 {
		t.Errorf("bob's session on the first API: %d", code)
	}
	if code, b := asCookie(s2, bob, "GET", api.SessionPath, nil); code != 200 || decode[api.SessionInfo](t, b).Name != "" {
		t.Errorf("bob's session after his key was removed: %d %s, want signed out", code, b)
	}
	if code, _ := asCookie(s2, bob, "GET", "/v1/batches/"+id, nil); code != 401 {
		t.Errorf("bob's cookie after his key was removed: %d, want 401", code)
	}
}

func TestDashboardServedAndAuthOff(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil)
	code, _, hdr := s.DoH("GET", "/", nil)
	// http.DefaultClient follows the redirect to the page.
	if code != 200 || !strings.Contains(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %v", code, hdr)
	}
	for _, tc := range []struct{ path, ctype string }{
		{"/ui/", "text/html"}, {"/ui/app.js", "javascript"}, {"/ui/style.css", "text/css"}, {"/ui/favicon.svg", "image/svg+xml"},
	} {
		// HEAD answers as GET does, with no body.
		if code, b, hdr := s.DoH("HEAD", tc.path, nil); code != 200 || !strings.Contains(hdr.Get("Content-Type"), tc.ctype) || len(b) != 0 {
			t.Errorf("HEAD %s: %d %q, %d bytes of body", tc.path, code, hdr.Get("Content-Type"), len(b))
		}
		code, b, hdr := s.DoH("GET", tc.path, nil)
		if code != 200 || !strings.Contains(hdr.Get("Content-Type"), tc.ctype) || len(b) == 0 {
			t.Errorf("GET %s: %d %q", tc.path, code, hdr.Get("Content-Type"))
		}
		csp := hdr.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: CSP %q, nosniff %q", tc.path, csp, hdr.Get("X-Content-Type-Options"))
		}
		if code, _, _ := s.DoH("GET", tc.path, nil, "If-None-Match", hdr.Get("ETag")); code != 304 {
			t.Errorf("GET %s with its ETag: %d, want 304", tc.path, code)
		}
	}
	// With no keys the page needs no sign-in, and signing in is refused.
	if code, b := s.Do("GET", api.SessionPath, nil); code != 200 || decode[api.SessionInfo](t, b).Auth {
		t.Errorf("GET session, auth off: %d %s", code, b)
	}
	if code, b, _ := s.DoH("POST", api.SessionPath, `{"key":"x"}`, api.UIHeader, "1"); code != 409 {
		t.Errorf("sign in, auth off: %d %s, want 409", code, b)
	}
}

// Wrong keys posted to the sign-in count as failed authentications of the
// address, like wrong bearer keys: past AUTH_FAILURES_PER_MINUTE the
// address is refused, the right key too.
func TestSessionSignInFailuresLimited(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceUIKey, "AUTH_FAILURES_PER_MINUTE": "3"})
	var codes []int
	for range 5 {
		code, _, _ := s.DoH("POST", api.SessionPath, `{"key":"not-alices-key-at-all"}`, api.UIHeader, "1")
		codes = append(codes, code)
	}
	if codes[0] != 401 || codes[4] != 429 {
		t.Errorf("five wrong sign-ins answered %v, want 401 first and 429 last", codes)
	}
	if code, b, _ := s.DoH("POST", api.SessionPath, `{"key":"`+aliceUIKey+`"}`, api.UIHeader, "1"); code != 429 {
		t.Errorf("the right key from a refused address: %d %s, want 429", code, b)
	}
}

// signIn posts a sign-in with key and returns the answer and the session
// cookie's value ("" when none was set).
func signIn(s *stacktest.Stack, key string) (int, []byte, http.Header, string) {
	code, b, hdr := s.DoH("POST", api.SessionPath, `{"key":"`+key+`"}`, api.UIHeader, "1")
	for _, c := range (&http.Response{Header: hdr}).Cookies() {
		if c.Name == api.SessionCookie {
			return code, b, hdr, c.Value
		}
	}
	return code, b, hdr, ""
}

// sessionsOf counts the session records and the indexed sessions of the
// key key in Redis.
func sessionsOf(t *testing.T, rdb *redis.Client, key string) (records, indexed int) {
	t.Helper()
	ctx := context.Background()
	d := sha256.Sum256([]byte(key))
	ks, err := rdb.Keys(ctx, "pq:session:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		v, _ := rdb.Get(ctx, k).Result()
		if strings.HasPrefix(v, hex.EncodeToString(d[:])+":") {
			records++
		}
	}
	n, err := rdb.ZCard(ctx, "pq:sessions:key:"+hex.EncodeToString(d[:])).Result()
	if err != nil {
		t.Fatal(err)
	}
	return records, int(n)
}

// 500 rapid sign-ins with one key, from one address, through two API
// replicas on one Redis: past SIGN_INS_PER_KEY_PER_MINUTE (counted in
// Redis, so the replicas share it) each is refused 429 with Retry-After
// and the error body, and the key never holds more than SESSIONS_PER_KEY
// live sessions, in Redis or as cookies that work.
func TestSessionSignInsBounded(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	env := map[string]string{"REDIS_URL": r.URL(), "API_KEYS": "alice:" + aliceUIKey + ",bob:" + bobUIKey,
		"SIGN_INS_PER_KEY_PER_MINUTE": "8", "SIGN_INS_PER_ADDR_PER_MINUTE": "1000", "SESSIONS_PER_KEY": "3"}
	s1 := stacktest.StartWith(t, 0, env)
	s2 := stacktest.StartWith(t, 0, env)
	rdb := r.Client(t)

	var cookies []string
	refused, refilled := 0, 0
	start := time.Now()
	// refills is how many sign-ins the limit may have given back by now: 8
	// a minute refill one every 7.5 s. The loop takes a second or two on a
	// quiet machine, so none; a loaded one may take longer.
	refills := func() int { return int(time.Since(start) / (7500 * time.Millisecond)) }
	for i := range 500 {
		s := []*stacktest.Stack{s1, s2}[i%2]
		code, b, hdr, tok := signIn(s, aliceUIKey)
		switch code {
		case 200:
			if refused > 0 {
				refilled++
				if refilled > refills() {
					t.Fatalf("sign-in %d accepted after %d refusals, %v after the first sign-in: %d accepted past the first 8, want at most %d",
						i, refused, time.Since(start).Round(time.Millisecond), refilled, refills())
				}
			}
			cookies = append(cookies, tok)
		case 429:
			refused++
			eb := decode[apitype.ErrorBody](t, b)
			ra, err := strconv.Atoi(hdr.Get("Retry-After"))
			if eb.Error.Code != apitype.CodeRateLimited || !strings.Contains(eb.Error.Message, "SIGN_INS_PER_KEY_PER_MINUTE") || err != nil || ra < 1 || tok != "" {
				t.Fatalf("sign-in %d refused with %s, Retry-After %q, cookie %q", i, b, hdr.Get("Retry-After"), tok)
			}
		default:
			t.Fatalf("sign-in %d: %d %s", i, code, b)
		}
		if i%50 == 0 || i == 499 {
			if rec, idx := sessionsOf(t, rdb, aliceUIKey); rec > 3 || idx > 3 {
				t.Fatalf("after %d sign-ins alice holds %d session records, %d indexed, want at most 3", i+1, rec, idx)
			}
		}
	}
	t.Logf("500 sign-ins in %v: %d accepted, %d refused 429", time.Since(start).Round(time.Millisecond), len(cookies), refused)
	if len(cookies) != 8+refilled || refused != 500-len(cookies) || refilled > refills() {
		t.Fatalf("%d accepted, %d refused, %d of them refills; want 8 plus at most %d refills, the rest refused", len(cookies), refused, refilled, refills())
	}
	// The oldest were ended first: the last three cookies work, the others
	// are signed out.
	for i, tok := range cookies {
		code, b := asCookie(s1, tok, "GET", "/v1/batches", nil)
		want := 200
		if i < len(cookies)-3 {
			want = 401
		}
		if code != want {
			t.Errorf("cookie %d of %d: %d %s, want %d", i+1, len(cookies), code, b, want)
		}
	}
	// Another key is not refused for alice's sign-ins.
	if code, b, _, _ := signIn(s2, bobUIKey); code != 200 {
		t.Errorf("bob's sign-in after alice's 500: %d %s", code, b)
	}
}

// Sign-ins from one client address are bounded whatever key they send:
// past SIGN_INS_PER_ADDR_PER_MINUTE, bob's first sign-in is refused too.
func TestSessionSignInsBoundedPerAddress(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceUIKey + ",bob:" + bobUIKey,
		"SIGN_INS_PER_KEY_PER_MINUTE": "100", "SIGN_INS_PER_ADDR_PER_MINUTE": "4"})
	for i := range 4 {
		if code, b, _, _ := signIn(s, aliceUIKey); code != 200 {
			t.Fatalf("sign-in %d: %d %s", i, code, b)
		}
	}
	code, b, hdr, _ := signIn(s, bobUIKey)
	if code != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(decode[apitype.ErrorBody](t, b).Error.Message, "SIGN_INS_PER_ADDR_PER_MINUTE") {
		t.Fatalf("bob's sign-in from alice's address past its limit: %d %s (Retry-After %q), want 429", code, b, hdr.Get("Retry-After"))
	}
}

// The sign-in body is read as every /v1 body is: exact names, no
// duplicate or unknown ones. {"KEY": ...} would sign in under a decoder
// that folds case; it is refused 400 with the error body naming it.
func TestSessionSignInBodyIsStrict(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceUIKey})
	for _, tc := range []struct{ name, body, field string }{
		{"KEY", `{"KEY":"` + aliceUIKey + `"}`, "KEY"},
		{"Key", `{"Key":"` + aliceUIKey + `"}`, "Key"},
		{"key twice", `{"key":"nope","key":"` + aliceUIKey + `"}`, "key"},
		{"Kelvin-sign key", `{"\u212aey":"` + aliceUIKey + `"}`, "\u212aey"},
		{"null key", `{"key":null}`, "key"},
		{"two values", `{"key":"` + aliceUIKey + `"} {}`, ""},
	} {
		code, b, hdr := s.DoH("POST", api.SessionPath, tc.body, api.UIHeader, "1")
		eb := decode[apitype.ErrorBody](t, b)
		if code != 400 || eb.Error.Code != apitype.CodeInvalidRequest || eb.Error.Field != tc.field || eb.Error.Message == "" || hdr.Get("Set-Cookie") != "" {
			t.Errorf("%s: %d %s (Set-Cookie %q), want 400 invalid_request on %q", tc.name, code, b, hdr.Get("Set-Cookie"), tc.field)
		}
	}
}

// A session is bound to its key's life: an API started without alice's
// key ends her sessions, and once her key is added back her old cookie
// stays refused (401) while a new sign-in works. GET /ui/session says
// when the session ends, as the sign-in did.
func TestSessionOfARemovedKeyStaysEnded(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	withAlice := map[string]string{"REDIS_URL": r.URL(), "API_KEYS": "alice:" + aliceUIKey + ",bob:" + bobUIKey, "UI_SESSION_TTL": "2h"}
	s1 := stacktest.StartWith(t, 0, withAlice)
	code, b, _, old := signIn(s1, aliceUIKey)
	if code != 200 || old == "" {
		t.Fatalf("sign in: %d %s", code, b)
	}
	signed := decode[api.SessionInfo](t, b)
	code, b = asCookie(s1, old, "GET", api.SessionPath, nil)
	got := decode[api.SessionInfo](t, b)
	if code != 200 || got.Name != "alice" || got.ExpiresAt == nil || signed.ExpiresAt == nil || !got.ExpiresAt.Equal(*signed.ExpiresAt) {
		t.Fatalf("GET session: %d %s, want alice until %v", code, b, signed.ExpiresAt)
	}
	if d := time.Until(*got.ExpiresAt); d < 2*time.Hour-time.Minute || d > 2*time.Hour+time.Minute {
		t.Errorf("session ends in %v, want about UI_SESSION_TTL (2h)", d)
	}
	_, _, _, bobs := signIn(s1, bobUIKey)

	// An API without alice's key, on the same Redis: her session ends.
	s2 := stacktest.StartWith(t, 0, map[string]string{"REDIS_URL": r.URL(), "API_KEYS": "bob:" + bobUIKey})
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := asCookie(s1, old, "GET", "/v1/batches", nil)
		if code == 401 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's cookie on the API that still has her key: %d 10 s after an API started without it, want 401", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rec, idx := sessionsOf(t, r.Client(t), aliceUIKey); rec != 0 || idx != 0 {
		t.Errorf("alice's key removed: %d session records, %d indexed remain", rec, idx)
	}
	if code, _ := asCookie(s2, bobs, "GET", "/v1/batches", nil); code != 200 {
		t.Errorf("bob's cookie, his key kept: %d", code)
	}

	// Her key added back: the old cookie stays refused, a new sign-in works.
	s3 := stacktest.StartWith(t, 0, withAlice)
	if code, b := asCookie(s3, old, "GET", "/v1/batches", nil); code != 401 {
		t.Errorf("alice's old cookie after her key was added back: %d %s, want 401", code, b)
	}
	if code, b := asCookie(s3, old, "GET", api.SessionPath, nil); code != 200 || decode[api.SessionInfo](t, b).Name != "" || decode[api.SessionInfo](t, b).ExpiresAt != nil {
		t.Errorf("GET session with the old cookie: %d %s, want signed out", code, b)
	}
	code, b, _, fresh := signIn(s3, aliceUIKey)
	if code != 200 {
		t.Fatalf("sign in after her key was added back: %d %s", code, b)
	}
	if code, _ := asCookie(s3, fresh, "GET", "/v1/batches", nil); code != 200 {
		t.Errorf("her new cookie: %d", code)
	}
}
