package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shape of KEDA's pkg/scaling/scalers_builder.go: one switch on the
// trigger type in buildScaler, with comments between the cases.
const builderSrc = `// License header.

package scaling

import "fmt"

func buildScaler(triggerType string) (string, error) {
	// TRIGGERS-START
	switch triggerType {
	case "activemq":
		return "activemq", nil
	// TODO: use other way for test.
	case "external-mock":
		return "mock", nil
	case "redis":
		return "redis", nil
	case "redis-streams":
		return "streams", nil
	case "solr":
		return "solr", nil
	default:
		return "", fmt.Errorf("no scaler found for type: %s", triggerType)
	}
	// TRIGGERS-END
}
`

func TestRedisOnlyBuilderKeepsTheRedisCasesAndDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "scalers_builder.go")
	if err := os.WriteFile(path, []byte(builderSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := redisOnlyBuilder(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{`// License header.`, `case "redis":`, `case "redis-streams":`, `default:`, `// TRIGGERS-START`, `// TRIGGERS-END`} {
		if !strings.Contains(got, want) {
			t.Errorf("rewritten file lacks %q:\n%s", want, got)
		}
	}
	for _, gone := range []string{`"activemq"`, `"external-mock"`, `"solr"`, `TODO`} {
		if strings.Contains(got, gone) {
			t.Errorf("rewritten file still has %q:\n%s", gone, got)
		}
	}
}

func TestRedisOnlyBuilderFailsWithoutARedisCase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "scalers_builder.go")
	src := strings.NewReplacer(`"redis"`, `"other"`, `"redis-streams"`, `"other2"`).Replace(builderSrc)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := redisOnlyBuilder(path); err == nil || !strings.Contains(err.Error(), "no redis case") {
		t.Fatalf("err = %v, want one saying there is no redis case", err)
	}
}
