package stacktest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BuildBinaries builds cmd/api and cmd/worker into dir, for tests that
// run them as processes (test/fault kills and freezes them), and returns
// their paths. They are built as scripts/build.sh builds the image's
// binaries (BuildEnv, -trimpath), so that they are the binaries that
// ship and a test run compiles each package once for both.
func BuildBinaries(dir string) (apiBin, workerBin string, err error) {
	apiBin, workerBin = filepath.Join(dir, "api"), filepath.Join(dir, "worker")
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+string(filepath.Separator),
		"github.com/puzzleq/puzzleq/cmd/api", "github.com/puzzleq/puzzleq/cmd/worker")
	cmd.Env = append(os.Environ(), BuildEnv...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build cmd/api cmd/worker: %w", err)
	}
	return apiBin, workerBin, nil
}

// BuildEnv is the environment, beside -trimpath, of every build that is
// not the race run: scripts/build.sh's (static, no cgo). go build,
// go vet and go test compile a package again for each configuration, so
// the tests that build binaries and .ci/run's non-race steps use this one.
var BuildEnv = []string{"CGO_ENABLED=0"}

// Proc is a running api or worker process. Its output goes to a file in
// the test's temporary directory, printed when the test fails.
type Proc struct {
	Name    string
	Addr    string // its HTTP_ADDR
	LogPath string // its stdout and stderr

	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit error, once done is closed
}

// StartProc starts bin with env (and nothing else from the test's own
// environment but PATH and HOME), waits for its /readyz on env's
// HTTP_ADDR, and kills it when the test ends.
func StartProc(t testing.TB, name, bin string, env map[string]string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Addr: env["HTTP_ADDR"], done: make(chan struct{})}
	p.LogPath = filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			p.Dump(t)
		}
		p.keep(t)
	})
	p.WaitReady(t, 30*time.Second)
	return p
}

// KeepLogsEnv names a directory into which every process's log is copied
// when its test ends, passed or failed: a passing fault case's logs (the
// watchdog's re-drives, say) are otherwise lost with its temporary
// directory.
const KeepLogsEnv = "PUZZLEQ_KEEP_LOGS"

// keep copies the log into $PUZZLEQ_KEEP_LOGS, named by the test, the
// process and its PID, when that is set.
func (p *Proc) keep(t testing.TB) {
	dir := os.Getenv(KeepLogsEnv)
	if dir == "" {
		return
	}
	<-p.done // Kill reaped it; the log is complete
	b, err := os.ReadFile(p.LogPath)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		name := strings.ReplaceAll(t.Name(), "/", "_") + "-" + p.Name + "-" + strconv.Itoa(p.PID()) + ".log"
		err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if err != nil {
		t.Logf("%s: keep the log of %s: %v", KeepLogsEnv, p.Name, err)
	}
}

// workerIDInLog finds a worker's name (worker.NewWorkerID) in its log
// lines, JSON or text: every line a worker logs carries it.
var workerIDInLog = regexp.MustCompile(`worker_id"?[=:]"?(w-[0-9a-f]{12})\b`)

// WorkerID returns the name a worker process goes by (its log's
// worker_id), waiting up to 10 s for the first line that carries it.
func (p *Proc) WorkerID(t testing.TB) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			t.Fatalf("the log of %s: %v", p.Name, err)
		}
		if m := workerIDInLog.FindSubmatch(b); m != nil {
			return string(m[1])
		}
		if time.Now().After(deadline) {
			t.Fatalf("no worker_id in the log of %s after 10 s", p.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PID is the process ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// URL is the process's HTTP base URL.
func (p *Proc) URL() string { return "http://" + p.Addr }

// Done is closed once the process has ended and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error, once Done is closed.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.Name, err)
	}
}

// Kill ends the process with SIGKILL, if it runs, and reaps it.
func (p *Proc) Kill() {
	if !p.Exited() {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// WaitExit waits up to d for the process to end.
func (p *Proc) WaitExit(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// WaitReady polls /readyz until it answers 200.
func (p *Proc) WaitReady(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	c := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := c.Get(p.URL() + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.Exited() {
			t.Fatalf("%s exited before it was ready: %v\n%s", p.Name, p.err, Tail(p.LogPath, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v (last: %v)\n%s", p.Name, d, err, Tail(p.LogPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PeakRSS is the process's peak resident set (VmHWM) in KiB; 0 once it
// has exited.
func (p *Proc) PeakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// Dump prints the end of the process's output to the test's log.
func (p *Proc) Dump(t testing.TB) {
	t.Logf("---- %s (pid %d) output, last lines ----\n%s", p.Name, p.PID(), Tail(p.LogPath, 80))
}

// Tail returns the last n lines of the file at path.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
