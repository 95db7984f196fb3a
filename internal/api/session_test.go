package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

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
		{"/ui/", "text/html"}, {"/ui/app.js", "javascript"}, {"/ui/style.css", "text/css"},
	} {
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
