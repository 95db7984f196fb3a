package app

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/puzzleq/puzzleq/internal/api"
)

// keyName limits API key names to characters that are safe in Redis key
// names and logs.
var keyName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// loadKeys reads API_KEYS ("name:key,name:key") and API_KEYS_FILE (a JSON
// list of {"name", "key", "rate_per_second", "burst", "max_pending"}).
// Errors name the setting and the entry, never the key itself.
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
		var fileKeys []api.APIKey
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&fileKeys); err != nil {
			return nil, fmt.Errorf("API_KEYS_FILE: expected a JSON list of {name, key, rate_per_second, burst, max_pending}: %v", err)
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
