package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal: only then is a progress bar
// drawn, so redirected stderr (CI logs, files) stays clean.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress shows submitted and completed counts of a run. A nil *progress
// draws nothing, so callers need not check.
type progress struct {
	bar       *progressbar.ProgressBar
	total     int
	wait      bool
	submitted atomic.Int64
	completed atomic.Int64
	mu        sync.Mutex
	stop      chan struct{}
	done      chan struct{}
}

// newProgress returns a bar on w when w is a terminal, else nil. The bar's
// value is the tasks completed (with wait) or submitted (without); the
// description carries the other count. progressbar computes the rate
// (tasks/s) and the ETA.
func newProgress(w io.Writer, total int, wait bool) *progress {
	if !isTerminal(w) || total == 0 {
		return nil
	}
	p := &progress{total: total, wait: wait, stop: make(chan struct{}), done: make(chan struct{})}
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("tasks"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSetDescription(p.describe()),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	go p.loop()
	return p
}

func (p *progress) describe() string {
	if p.wait {
		return fmt.Sprintf("submitted %d/%d, completed", p.submitted.Load(), p.total)
	}
	return "submitted"
}

// loop redraws a few times a second, so the rate and ETA move even while
// counts arrive in batch-sized steps.
func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.redraw()
		}
	}
}

func (p *progress) redraw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar.Describe(p.describe())
	v := p.submitted.Load()
	if p.wait {
		v = p.completed.Load()
	}
	_ = p.bar.Set64(v)
}

// notes serializes notes written without a bar, which come from several
// goroutines.
var notes sync.Mutex

// note writes a line to w above the bar (or alone, with no bar), so the
// bar is redrawn below it rather than the line being drawn over.
func (p *progress) note(w io.Writer, line string) {
	if p == nil {
		notes.Lock()
		defer notes.Unlock()
		fmt.Fprintln(w, line)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(w, "\r\x1b[K%s\n", line)
}

func (p *progress) addSubmitted(n int) {
	if p != nil {
		p.submitted.Add(int64(n))
	}
}

func (p *progress) addCompleted(n int) {
	if p != nil && n != 0 {
		p.completed.Add(int64(n))
	}
}

// finish draws the last state and ends the bar's line.
func (p *progress) finish() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.redraw()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.bar.IsFinished() {
		_ = p.bar.Exit() // its completion hook ends the line
	}
}
