// Package docs_test holds the documentation to what the code does: the
// README's examples run as a reader pastes them, and the settings page
// lists exactly the settings the binaries read.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const root = "../.."

// block is one fenced `sh` block of the README, split into commands.
type block struct {
	line     int // of the fence, for messages
	commands []command
}

// command is one shell command (its continuation lines included) and the
// output the README shows for it: the `# ` lines right below it.
type command struct {
	line int
	text string
	want []string
}

// readmeBlocks returns the `sh` blocks above the "## Deployment" heading:
// the ones a reader can paste on a fresh clone with nothing but the
// embedded API. The blocks below it need Redis, Docker or a cluster, and
// test/k8s and deploy/ check what they run.
func readmeBlocks(t *testing.T, readme string) []block {
	t.Helper()
	var (
		blocks []block
		cur    *block
		cmd    *command
	)
	for i, l := range strings.Split(readme, "\n") {
		n := i + 1
		switch {
		case cur == nil && strings.HasPrefix(l, "## Deployment"):
			return blocks
		case cur == nil && strings.TrimSpace(l) == "```sh":
			cur = &block{line: n}
		case cur == nil:
		case strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur, cmd = nil, nil
		case strings.HasPrefix(l, "# ") || l == "#":
			if cmd == nil {
				t.Fatalf("README.md:%d: an output line with no command above it", n)
			}
			cmd.want = append(cmd.want, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
		case strings.TrimSpace(l) == "":
			cmd = nil
		default:
			prev := len(cur.commands) - 1
			if prev >= 0 && cmd != nil && len(cmd.want) == 0 && continues(cur.commands[prev].text) {
				cur.commands[prev].text += "\n" + l
				continue
			}
			cur.commands = append(cur.commands, command{line: n, text: l})
			cmd = &cur.commands[len(cur.commands)-1]
		}
	}
	t.Fatal("README.md has no \"## Deployment\" heading, which ends the examples this test runs")
	return nil
}

// continues reports whether a shell line goes on on the next line.
func continues(text string) bool {
	last := text[strings.LastIndex(text, "\n")+1:]
	if i := strings.Index(last, "  #"); i >= 0 {
		last = last[:i]
	}
	last = strings.TrimSpace(last)
	return strings.HasSuffix(last, "\\") || strings.HasSuffix(last, "|") || strings.HasSuffix(last, "&&")
}

// prelude stands in for the go command, so that the README's
// `go run ./cmd/...` lines run the binaries this test built, and the
// quick start's `go test` (this very suite) is not run again.
// `go run ./cmd/api` becomes the API (exec), so that `&` and `$!` mean
// what they say. stop_api, which the script runs before any line that
// starts an API, stops the one an earlier line started, as a reader stops
// the quick start's with Ctrl-C before starting another: before that
// line, not in its background job, so that nothing after it can reach
// the old API.
const prelude = `
api_pid_file="$PQ_DIR/api.pid"
stop_api() {
  [ -s "$api_pid_file" ] || return 0
  old=$(cat "$api_pid_file")
  kill "$old" 2>/dev/null
  for _ in $(seq 300); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  : > "$api_pid_file"
}
go() {
  case "$1 $2" in
  "run ./cmd/api")
    shift 2
    echo "$BASHPID" > "$api_pid_file"
    exec "$PQ_API" "$@" >>"$PQ_DIR/api.log" 2>&1 ;;
  "run ./cmd/puzzlectl") shift 2; "$PQ_PUZZLECTL" "$@" ;;
  "test "*) ;;
  *) echo "README test: no stand-in for: go $*" >&2; return 127 ;;
  esac
}
wait_ready() {
  for _ in $(seq 1800); do
    curl -sf "http://$PQ_ADDR/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "README test: the API was not ready within 3 minutes" >&2
  return 1
}
`

// TestREADMEExamples runs every example above the README's Deployment
// section, in order, in one shell, against the built cmd/api in its
// embedded mode and cmd/puzzlectl, as a reader on a fresh clone would:
// each command must exit 0, and print what the README shows below it
// (`…` stands for any text).
func TestREADMEExamples(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed, and the README's examples need it", tool)
			}
			t.Skipf("%s is not installed, and the README's examples need it", tool)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, string(readme))
	if len(blocks) < 4 {
		t.Fatalf("found %d example blocks above Deployment; the README has lost its examples", len(blocks))
	}

	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./cmd/api", "./cmd/puzzlectl")
	build.Dir = root
	build.Env = append(os.Environ(), stacktest.BuildEnv...) // scripts/build.sh's configuration
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	port := freePort(t)
	addr := "localhost:" + strconv.Itoa(port)
	work := filepath.Join(dir, "clone") // where the reader's files (jobs.jsonl) go
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}

	// The script: each command between markers carrying its index, and
	// its exit status after it. The README's port becomes a free one.
	var script strings.Builder
	script.WriteString(prelude)
	var cmds []command
	for _, b := range blocks {
		for _, c := range b.commands {
			text := strings.ReplaceAll(c.text, "localhost:8080", addr)
			fmt.Fprintf(&script, "echo '@@begin %d'\n", len(cmds))
			if strings.Contains(c.text, "go run ./cmd/api") {
				script.WriteString("stop_api\n")
			}
			if isQuickStartAPI(c.text) {
				// Run in a terminal of its own by the reader.
				fmt.Fprintf(&script, "%s &\nwait_ready\n", strings.TrimSpace(stripComment(text)))
			} else {
				fmt.Fprintf(&script, "%s\n", text)
			}
			fmt.Fprintf(&script, "echo \"@@end %d $?\"\n", len(cmds))
			cmds = append(cmds, c)
		}
	}
	script.WriteString(`[ -s "$api_pid_file" ] && kill "$(cat "$api_pid_file")" 2>/dev/null` + "\nexit 0\n")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", script.String())
	sh.Dir = work
	sh.Env = append(os.Environ(),
		"PQ_DIR="+dir, "PQ_API="+filepath.Join(dir, "api"), "PQ_PUZZLECTL="+filepath.Join(dir, "puzzlectl"),
		"PQ_ADDR="+addr, "HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "PUZZLEQ_URL=http://"+addr,
		"HOME="+dir, // puzzlectl's pattern-database cache, kept out of the user's
	)
	// Unset what would point the API or puzzlectl elsewhere.
	for _, k := range []string{"REDIS_URL", "REDIS_SENTINELS", "API_KEYS", "API_KEYS_FILE", "PUZZLEQ_API_KEY", "WEBHOOK_SECRET"} {
		sh.Env = append(sh.Env, k+"=")
	}
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &stdout, &stderr
	runErr := sh.Run()
	// Whatever the script left running (an API it started) goes with it.
	if sh.Process != nil {
		syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
	}
	logs := func() string {
		api, _ := os.ReadFile(filepath.Join(dir, "api.log"))
		return fmt.Sprintf("stderr:\n%s\napi log (tail):\n%s", tail(stderr.String(), 40), tail(string(api), 20))
	}
	if runErr != nil {
		t.Fatalf("the README's script: %v\n%s", runErr, logs())
	}

	outs, codes := splitOutput(t, stdout.String(), len(cmds))
	failed := false
	for i, c := range cmds {
		if codes[i] != 0 {
			t.Errorf("README.md:%d: exit status %d:\n%s\noutput:\n%s", c.line, codes[i], c.text, strings.Join(outs[i], "\n"))
			failed = true
			continue
		}
		if len(c.want) == 0 {
			continue
		}
		if !matchLines(c.want, outs[i], addr) {
			t.Errorf("README.md:%d: the output differs from what the README shows:\n%s\nshown:\n%s\ngot:\n%s",
				c.line, c.text, strings.Join(c.want, "\n"), strings.Join(outs[i], "\n"))
			failed = true
		}
	}
	if failed {
		t.Log(logs())
	}
}

// isQuickStartAPI is a foreground `go run ./cmd/api`: the quick start's
// first command, which a reader leaves running in a terminal of its own.
func isQuickStartAPI(text string) bool {
	s := strings.TrimSpace(stripComment(text))
	return s == "go run ./cmd/api"
}

func stripComment(text string) string {
	if i := strings.Index(text, " #"); i >= 0 {
		return text[:i]
	}
	return text
}

// splitOutput cuts the script's stdout at the markers: each command's
// lines and exit status.
func splitOutput(t *testing.T, out string, n int) ([][]string, []int) {
	t.Helper()
	outs, codes := make([][]string, n), make([]int, n)
	for i := range codes {
		codes[i] = -1 // never reached
	}
	cur := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		var i, code int
		if _, err := fmt.Sscanf(l, "@@begin %d", &i); err == nil && strings.HasPrefix(l, "@@begin ") {
			cur = i
			continue
		}
		if _, err := fmt.Sscanf(l, "@@end %d %d", &i, &code); err == nil && strings.HasPrefix(l, "@@end ") {
			codes[i] = code
			cur = -1
			continue
		}
		if cur >= 0 {
			outs[cur] = append(outs[cur], l)
		}
	}
	return outs, codes
}

// matchLines compares output with the lines the README shows, where `…`
// stands for any text and the README's port for the test's.
func matchLines(want, got []string, addr string) bool {
	if len(want) != len(got) {
		return false
	}
	for i, w := range want {
		w = strings.ReplaceAll(w, "localhost:8080", addr)
		parts := strings.Split(w, "…")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		if !regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got[i]) {
			return false
		}
	}
	return true
}

func freePort(t testing.TB) int {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
