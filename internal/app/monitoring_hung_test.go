package app_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestMonitoringFailsFastWhenRedisHangs: with Redis frozen (SIGSTOP), the
// dashboard's API answers 503 unavailable in the API's error shape within
// the 2.5 s every route promises (issue 13), and answers again once Redis
// resumes. A request that finds Redis frozen meets the operator rate
// limit's call first; one that passed it before the freeze meets
// asynqmon's own clients, which TestDashboardClientFailsFast and
// TestNo5xxAnswersUnavailable hold to the same bound and shape.
func TestMonitoringFailsFastWhenRedisHangs(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil)
	const path = "/monitoring/api/queues"
	if code, b := s.Do("GET", path, nil); code != 200 {
		t.Fatalf("GET %s before the freeze: %d %.300s", path, code, b)
	}
	if err := s.Redis.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := s.Redis.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer thaw()
	start := time.Now()
	code, b := s.Do("GET", path, nil)
	took := time.Since(start)
	var e apitype.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil || code != 503 || e.Error.Code != apitype.CodeUnavailable {
		t.Errorf("GET %s with Redis frozen: %d %.300s, want 503 unavailable", path, code, b)
	}
	if took > 2500*time.Millisecond {
		t.Errorf("GET %s with Redis frozen answered after %v, want within 2.5 s", path, took)
	}
	t.Logf("FIGURES dashboard with Redis frozen: %d after %v", code, took.Round(time.Millisecond))
	thaw()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, b := s.Do("GET", path, nil)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s 10 s after Redis resumed: %d %.300s", path, code, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
