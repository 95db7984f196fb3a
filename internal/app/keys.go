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

// MinKeyBytes is the shortest key accepted: 16 bytes, 128 bits when
// random (openssl rand -hex 16 gives 32), beyond any guessing at the
// failed-authentication limit. A short key is a typo or a placeholder.
const MinKeyBytes = 16

// MaxKeyWeight bounds a key's weight in the share of solver slots: a
// larger ratio between two keys would leave the lighter one no slot of
// any cluster this runs on.
const MaxKeyWeight = 1000

// keyWeights is each key's weight in the share of solver slots, as the
// store records it (store.SetWeights): the tenant keys' weights, 1 when
// unset.
func keyWeights(keys []api.APIKey) map[string]int {
	w := make(map[string]int, len(keys))
	for _, k := range keys {
		if !k.IsOperator() {
			w[k.Name] = max(k.Weight, 1)
		}
	}
	return w
}

// loadKeys reads API_KEYS and OPERATOR_KEYS ("name:key,name:key") and
// API_KEYS_FILE (a JSON list of {"name", "key", "rate_per_second",
// "burst", "max_pending", "role", "weight"}, with exact names, none repeated and no
// others). Names are unique across all three, every key is at least
// MinKeyBytes long, and no two names share one secret: the server could
// not tell them apart, and would credit one's work to the other. Errors
// name the setting and the entry, never the key itself.
func (c *APIConfig) loadKeys() ([]api.APIKey, error) {
	var keys []api.APIKey
	var from []string // the setting each key came from
	for _, list := range []struct {
		setting, value, role string
	}{{"API_KEYS", c.APIKeys, api.RoleTenant}, {"OPERATOR_KEYS", c.OperatorKeys, api.RoleOperator}} {
		if list.value == "" {
			continue
		}
		for i, part := range strings.Split(list.value, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			name, key, ok := strings.Cut(part, ":")
			if !ok {
				return nil, fmt.Errorf("%s: entry %d is not name:key", list.setting, i+1)
			}
			keys = append(keys, api.APIKey{Name: name, Key: key, Role: list.role})
			from = append(from, list.setting)
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
			return nil, fmt.Errorf("API_KEYS_FILE: expected a JSON list of {name, key, rate_per_second, burst, max_pending, role, weight}: %s", keysFileError(err))
		}
		for _, k := range fileKeys {
			keys = append(keys, k)
			from = append(from, "API_KEYS_FILE")
		}
	}
	names := map[string]bool{}
	secrets := map[string]string{} // key -> name
	for i, k := range keys {
		if !keyName.MatchString(k.Name) {
			return nil, fmt.Errorf("%s: entry %d: name %q must be 1-64 of A-Z a-z 0-9 _ . -", from[i], i+1, k.Name)
		}
		if k.Key == "" {
			return nil, fmt.Errorf("%s: %s has an empty key", from[i], k.Name)
		}
		if len(k.Key) < MinKeyBytes {
			return nil, fmt.Errorf("%s: %s's key is %d bytes; keys must be at least %d (openssl rand -hex 16 makes one)",
				from[i], k.Name, len(k.Key), MinKeyBytes)
		}
		if names[k.Name] {
			return nil, fmt.Errorf("%s: %s appears twice (names are unique across API_KEYS, OPERATOR_KEYS and API_KEYS_FILE)", from[i], k.Name)
		}
		if other, ok := secrets[k.Key]; ok {
			return nil, fmt.Errorf("%s: %s has the same key as %s; every name needs a secret of its own", from[i], k.Name, other)
		}
		if k.Role != "" && k.Role != api.RoleTenant && k.Role != api.RoleOperator {
			return nil, fmt.Errorf("%s: %s has role %q; want %q or %q", from[i], k.Name, k.Role, api.RoleTenant, api.RoleOperator)
		}
		if k.RatePerSecond < 0 || k.Burst < 0 || k.MaxPending < 0 {
			return nil, fmt.Errorf("%s: %s has a negative limit", from[i], k.Name)
		}
		if k.Weight < 0 || k.Weight > MaxKeyWeight {
			return nil, fmt.Errorf("%s: %s has weight %d; want 1 to %d (0 or none: 1)", from[i], k.Name, k.Weight, MaxKeyWeight)
		}
		names[k.Name] = true
		secrets[k.Key] = k.Name
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
