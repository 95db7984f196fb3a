package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			t.Errorf("method %s, want GET", r.Method)
		}
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte(`{"status":"ready"}`))
		case "/slow":
			<-r.Context().Done()
		default:
			http.Error(w, "draining", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz" // nothing answers here
	ln.Close()

	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"ok", []string{"-url", srv.URL + "/readyz"}, 0, ""},
		{"503", []string{"-url", srv.URL + "/down"}, 1, "503"},
		{"refused", []string{"-url", closed}, 1, "refused"},
		{"timeout", []string{"-url", srv.URL + "/slow", "-timeout", "50ms"}, 1, "deadline"},
		{"bad flag", []string{"-nope"}, 2, "flag provided but not defined"},
		{"extra arg", []string{"-url", srv.URL, "x"}, 2, "usage"},
		{"bad url", []string{"-url", "::"}, 2, "missing protocol scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if code := run(tc.args, &out); code != tc.code {
				t.Fatalf("exit %d, want %d (%s)", code, tc.code, out.String())
			}
			if !strings.Contains(out.String(), tc.msg) {
				t.Fatalf("output %q does not mention %q", out.String(), tc.msg)
			}
		})
	}
}
