package app

import (
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
	const secret = "s3cret-9f8e7d"
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
