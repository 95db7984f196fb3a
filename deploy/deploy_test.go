package deploy_test

import (
	"regexp"

	"github.com/hibiken/asynq"
	"path/filepath"
	"strings"
	"testing"
)

// TestKustomizeOverlays renders the base and every overlay and checks
// them against the code.
func TestKustomizeOverlays(t *testing.T) {
	f := newFacts(t)
	for _, e := range overlays {
		t.Run(e.name(), func(t *testing.T) {
			objs := renderExpect(t, e)
			if problems := checkK8s(f, e, objs); len(problems) > 0 {
				t.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
			}
		})
	}
}

// TestComposeFile loads docker-compose.yml with compose-go and checks it
// against the code.
func TestComposeFile(t *testing.T) {
	f := newFacts(t)
	if problems := checkCompose(f, filepath.Join(root, "docker-compose.yml")); len(problems) > 0 {
		t.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// TestSentinelURLInREADME: the Sentinel REDIS_URL the README shows is one
// both binaries accept, and it selects asynq's failover client.
func TestSentinelURLInREADME(t *testing.T) {
	m := regexp.MustCompile("`(redis-sentinel://[^`]+)`").FindStringSubmatch(readFile(t, filepath.Join(root, "README.md")))
	if m == nil {
		t.Fatal("README.md shows no redis-sentinel:// URL")
	}
	for bin, load := range newLoaders() {
		if _, err := load(map[string]string{"REDIS_URL": m[1]}); err != nil {
			t.Errorf("the %s rejects the README's %s: %v", bin, m[1], err)
		}
	}
	opt, err := asynq.ParseRedisURI(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := opt.(asynq.RedisFailoverClientOpt); !ok || f.MasterName == "" || len(f.SentinelAddrs) < 2 {
		t.Errorf("%s parses to %#v, want a failover client with a master and sentinels", m[1], opt)
	}
}
