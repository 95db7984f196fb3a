package app

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// keyName limits API key names to characters that are safe in Redis key
// names and logs.
var keyName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// loadKeys reads API_KEYS ("name:key,name:key") and API_KEYS_FILE (a JSON
// list of {"name", "key", "rate_per_second", "burst", "max_pending"}, with
// exact names, none repeated and no others). Errors name the setting and
// the entry, never the key itself.
func (c *APIConfig) loadKeys() ([]api.APIKey, error) {
	var keys []api.APIKey
	if c.APIKeys != "" {
		for i, part := range strings.Split(c.APIKeys, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			name, key, ok := strings.Cut(part, ":")
			if !ok {
				return nil, fmt.Errorf("API_KEYS: entry %d is not name:key", i+1)
			}
			keys = append(keys, api.APIKey{Name: name, Key: key})
		}
	}
	if c.APIKeysFile != "" {
		b, err := os.ReadFile(c.APIKeysFile)
		if err != nil {
			return nil, fmt.Errorf("API_KEYS_FILE: %w", err)
		}
		// Strictly, as requests are: with encoding/json, {"KEY": ...}
		// was taken for "key", and the last of two "key"s won.
		var fileKeys []api.APIKey
		if err := puzzle.DecodeStrict(b, &fileKeys); err != nil {
			return nil, fmt.Errorf("API_KEYS_FILE: expected a JSON list of {name, key, rate_per_second, burst, max_pending}: %s", keysFileError(err))
		}
		keys = append(keys, fileKeys...)
	}
	names := map[string]bool{}
	for i, k := range keys {
		if !keyName.MatchString(k.Name) {
			return nil, fmt.Errorf("API keys: entry %d: name %q must be 1-64 of A-Z a-z 0-9 _ . -", i+1, k.Name)
		}
		if k.Key == "" {
			return nil, fmt.Errorf("API keys: %s has an empty key", k.Name)
		}
		if names[k.Name] {
			return nil, fmt.Errorf("API keys: %s appears twice", k.Name)
		}
		if k.RatePerSecond < 0 || k.Burst < 0 || k.MaxPending < 0 {
			return nil, fmt.Errorf("API keys: %s has a negative limit", k.Name)
		}
		names[k.Name] = true
	}
	return keys, nil
}

// keysFileError says where the keys file is wrong ("[2].KEY: unknown
// field"), but not what a key's place holds ("got number ..."): that may
// be the secret.
func keysFileError(err error) string {
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		return err.Error()
	}
	msg := ie.Msg
	if i := strings.Index(msg, ", got "); i >= 0 && strings.HasSuffix(ie.Field, ".key") {
		msg = msg[:i]
	}
	if ie.Field == "" || strings.HasPrefix(msg, ie.Field+": ") {
		return msg
	}
	return ie.Field + ": " + msg
}
