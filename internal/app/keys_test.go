package app

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/api"
)

// TestKeysFileIsStrict holds API_KEYS_FILE to the rules requests are held
// to: names exact (encoding/json took "KEY", and "\u212Aey" with a Kelvin
// sign, for "key"), none repeated (it kept the last), no unknown names and
// nothing after the list. Every error names the setting and the place,
// and none shows the secret.
func TestKeysFileIsStrict(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-9f8e7d6c5b4a"
	load := func(body string) ([]api.APIKey, error) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "keys.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return (&APIConfig{APIKeysFile: f}).loadKeys()
	}
	keys, err := load(`[{"name":"bob","key":"` + secret + `","rate_per_second":2,"burst":3,"max_pending":4}]`)
	if want := []api.APIKey{{Name: "bob", Key: secret, RatePerSecond: 2, Burst: 3, MaxPending: 4}}; err != nil || !reflect.DeepEqual(keys, want) {
		t.Fatalf("valid file: %+v %v, want %+v", keys, err, want)
	}
	for _, tc := range []struct{ name, body, place string }{
		{"upper-case name", `[{"name":"bob","KEY":"` + secret + `"}]`, `[0].KEY: unknown field "KEY"`},
		{"Kelvin sign", `[{"name":"bob","\u212Aey":"` + secret + `"}]`, "[0].\u212Aey: unknown field"},
		{"mixed-case limit", `[{"name":"bob","key":"` + secret + `","Burst":3}]`, `[0].Burst: unknown field`},
		{"repeated name", `[{"name":"bob","key":"x","key":"` + secret + `"}]`, `[0].key: key "key" appears twice`},
		{"unknown field", `[{"name":"bob","key":"` + secret + `","owner":"x"}]`, `[0].owner: unknown field`},
		{"two values", `[{"name":"bob","key":"` + secret + `"}] []`, "after the JSON value"},
		{"key not a string", `[{"name":"bob","key":98765}]`, "[0].key: expected a string"},
	} {
		keys, err := load(tc.body)
		switch {
		case err == nil:
			t.Errorf("%s: accepted as %+v", tc.name, keys)
		case !strings.HasPrefix(err.Error(), "API_KEYS_FILE: ") || !strings.Contains(err.Error(), tc.place):
			t.Errorf("%s: %q, want API_KEYS_FILE and %q", tc.name, err, tc.place)
		case strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "98765"):
			t.Errorf("%s: the error shows the key: %q", tc.name, err)
		}
	}
}

// TestKeysRefusedAtStart: a short key, one secret under two names, a name
// used by a tenant and an operator, and an unknown role each stop the API
// at start, with the setting named and the secret not shown.
func TestKeysRefusedAtStart(t *testing.T) {
	t.Parallel()
	const long, other = "0123456789abcdef-long", "fedcba9876543210-other"
	file := func(body string) string {
		t.Helper()
		f := filepath.Join(t.TempDir(), "keys.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // in the error
	}{
		{"short tenant key", map[string]string{"API_KEYS": "alice:short-key"}, "API_KEYS: alice's key is 9 bytes; keys must be at least 16"},
		{"short operator key", map[string]string{"OPERATOR_KEYS": "ops:0123456789abcde"}, "OPERATOR_KEYS: ops's key is 15 bytes"},
		{"short file key", map[string]string{"API_KEYS_FILE": file(`[{"name":"bob","key":"tiny"}]`)}, "API_KEYS_FILE: bob's key is 4 bytes"},
		{"shared secret", map[string]string{"API_KEYS": "alice:" + long + ",bob:" + long}, "API_KEYS: bob has the same key as alice"},
		{"tenant key as operator", map[string]string{"API_KEYS": "alice:" + long, "OPERATOR_KEYS": "ops:" + long}, "OPERATOR_KEYS: ops has the same key as alice"},
		{"file shares a secret", map[string]string{"API_KEYS": "alice:" + long, "API_KEYS_FILE": file(`[{"name":"ops","key":"` + long + `","role":"operator"}]`)},
			"API_KEYS_FILE: ops has the same key as alice"},
		{"name under two roles", map[string]string{"API_KEYS": "ops:" + long, "OPERATOR_KEYS": "ops:" + other}, "OPERATOR_KEYS: ops appears twice"},
		{"unknown role", map[string]string{"API_KEYS_FILE": file(`[{"name":"ops","key":"` + long + `","role":"admin"}]`)}, `API_KEYS_FILE: ops has role "admin"`},
	} {
		_, err := LoadAPIConfig(nil, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case err == nil:
			t.Errorf("%s: accepted", tc.name)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %q, want %q", tc.name, err, tc.want)
		case strings.Contains(err.Error(), long) || strings.Contains(err.Error(), "short-key") || strings.Contains(err.Error(), "tiny"):
			t.Errorf("%s: the error shows a key: %q", tc.name, err)
		}
	}
	// Roles as configured: API_KEYS tenants, OPERATOR_KEYS operators, the
	// file's entries as their role says.
	cfg, err := LoadAPIConfig(nil, func(k string) string {
		return map[string]string{"API_KEYS": "alice:" + long, "OPERATOR_KEYS": "ops:" + other,
			"API_KEYS_FILE": file(`[{"name":"ops2","key":"` + long + `-2","role":"operator"},{"name":"bob","key":"` + other + `-2"}]`)}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, k := range cfg.keys {
		roles = append(roles, k.Name+"="+k.Role)
	}
	if got, want := strings.Join(roles, " "), "alice=tenant ops=operator ops2=operator bob="; got != want {
		t.Errorf("roles %q, want %q", got, want)
	}
}

// TestKeyWeights: a key's weight in the share of solver slots comes from
// API_KEYS_FILE, 1 when unset; a negative weight or one over
// MaxKeyWeight stops the API at start, and operator keys, which run no
// work, have none.
func TestKeyWeights(t *testing.T) {
	t.Parallel()
	load := func(body string) ([]api.APIKey, error) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "keys.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return (&APIConfig{APIKeysFile: f}).loadKeys()
	}
	keys, err := load(`[{"name":"a","key":"a-secret-0123456789"},{"name":"b","key":"b-secret-0123456789","weight":3},` +
		`{"name":"op","key":"o-secret-0123456789","role":"operator"}]`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keyWeights(keys), map[string]int{"a": 1, "b": 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("weights %v, want %v", got, want)
	}
	for _, w := range []string{"-1", "1001"} {
		if _, err := load(`[{"name":"a","key":"a-secret-0123456789","weight":` + w + `}]`); err == nil || !strings.Contains(err.Error(), "weight") {
			t.Errorf("weight %s: %v, want an error naming the weight", w, err)
		}
	}
}
