package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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
	// baseline counts what had ended before this run (the batches of a
	// resumed run): it moves the bar but is not progress of this run, so
	// the rate leaves it out.
	baseline atomic.Int64
	mu       sync.Mutex
	stop     chan struct{}
	done     chan struct{}

	// Guarded by mu: when the bar started, and the moments the value
	// the rate is measured on rose, over the last rateWindow.
	start   time.Time
	samples []sample

	// Guarded by mu: the value drawn, and by how much a redraw moves it
	// toward the value (see ease).
	shown, step int64
}

// sample is the bar's value (less the baseline) at a moment it rose.
type sample struct {
	at time.Time
	v  int64
}

// tick is how often the bar is redrawn.
const tick = 200 * time.Millisecond

// easeTicks is over how many redraws a rise of the counts is spread: the
// counts are read every second (runner.countsEvery) and results arrive
// in chunks of hundreds, so the bar moves through a second's rise in
// steps rather than jumping, and is never more than a second behind.
const easeTicks = 5

// rateWidth is the width of the rate and ETA field: the widest text it
// holds at a pace up to 9.9 million tasks/s (rateString) and an ETA
// under 100 h (etaString). A longer text is cut, so the line keeps its width.
// Every column it holds is one the bar lacks on an 80-column terminal.
const rateWidth = len("99999 tasks/s, ETA 59m59s")

// rateWindow is how far back the rate looks: long enough to smooth the
// steps in which counts arrive, short enough to follow a change of pace.
const rateWindow = 10 * time.Second

// newProgress returns a bar on w when w is a terminal, else nil. The bar's
// value is the tasks completed (with wait) or submitted (without); the
// description carries the other count, the rate (tasks/s) and the ETA
// (rateText).
func newProgress(w io.Writer, total int, wait bool) *progress {
	if !isTerminal(w) || total == 0 {
		return nil
	}
	p := newBar(w, total, wait, time.Now())
	go p.loop()
	return p
}

// newBar draws the bar on w, at its start, without the redraws of loop:
// newProgress starts those, and tests drive redraw themselves.
func newBar(w io.Writer, total int, wait bool, start time.Time) *progress {
	p := &progress{total: total, wait: wait, stop: make(chan struct{}), done: make(chan struct{}), start: start}
	// The counts, the rate and the ETA are in the description, in
	// fields of fixed width: progressbar's own count, elapsed time and
	// rate print as wide as they are, so the line would change width
	// (and, on a terminal narrower than the line, so would the bar,
	// which progressbar fits to what is left). Its rate and ETA count
	// from its start, besides, so they read 0 until the first step and
	// count a resumed run's earlier work as done in an instant.
	// No throttle: the bar is drawn only by redraw, a tick apart, and
	// a throttle would drop a redraw's line for the one before it.
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionThrottle(0),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSetDescription(p.describe(start)),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	return p
}

// describe is the text after the bar: the value drawn, the other count,
// the rate and the ETA. The counts are padded to the width of the total
// and the rate to rateWidth, so the text is as wide at the end as at the
// start. Called with mu held (or before the bar exists).
func (p *progress) describe(now time.Time) string {
	d := len(strconv.Itoa(p.total))
	rate := fmt.Sprintf("%-*.*s", rateWidth, rateWidth, p.rateText(now))
	if p.wait {
		return fmt.Sprintf("%*d/%d completed; submitted %*d/%d; %s", d, p.shown, p.total, d, p.submitted.Load(), p.total, rate)
	}
	return fmt.Sprintf("%*d/%d submitted; %s", d, p.shown, p.total, rate)
}

// ease moves the value drawn toward the value: a rise is spread over the
// next easeTicks redraws, in equal steps. A further rise while it
// catches up can only make the step larger, so every count is drawn
// within easeTicks redraws of its arrival. Called with mu held.
func (p *progress) ease() {
	v := p.value()
	if v <= p.shown {
		p.shown, p.step = v, 0
		return
	}
	// While a rise is being eased, the step already covers what is left
	// of it in easeTicks redraws; only a further rise makes it larger.
	p.step = max(p.step, (v-p.shown+easeTicks-1)/easeTicks)
	p.shown = min(p.shown+p.step, v)
	if p.shown == v {
		p.step = 0
	}
}

// value is the bar's value: tasks completed with wait, else submitted.
func (p *progress) value() int64 {
	if p.wait {
		return p.completed.Load()
	}
	return p.submitted.Load()
}

// rateText measures the rate over the last rateWindow (or since the
// start, when shorter) of this run's own progress, and the time left at
// that rate. Within the first second it has nothing to measure yet.
//
// The counts rise in steps (a chunk of results, a read of the counts),
// so the rate is measured from the start of the window to the last rise
// rather than to now: measured to now, it would sink between steps and
// leap at each, though the pace is steady. Once the next rise is later
// than the rises so far have been apart on average, the measure runs to
// now again, so a stall lowers the rate (to 0 once the window holds no
// rise).
func (p *progress) rateText(now time.Time) string {
	v := p.value() - p.baseline.Load()
	if len(p.samples) == 0 {
		p.samples = []sample{{p.start, 0}}
	}
	// Only a rise is a sample: the value and the baseline are read
	// apart, and a resumed batch's work counts in both, so a drop is
	// that work seen in one and not yet the other.
	if v > p.samples[len(p.samples)-1].v {
		p.samples = append(p.samples, sample{now, v})
	}
	for len(p.samples) > 1 && now.Sub(p.samples[1].at) >= rateWindow {
		p.samples = p.samples[1:]
	}
	from, last := p.samples[0], p.samples[len(p.samples)-1]
	end := now
	if rises := len(p.samples) - 1; rises > 0 {
		gap := last.at.Sub(from.at) / time.Duration(rises)
		end = now.Add(-gap)
		if end.Before(last.at) {
			end = last.at
		}
	}
	el := end.Sub(from.at)
	left := int64(p.total) - p.value()
	if el <= 0 || (now.Sub(p.start) < time.Second && left > 0) {
		return "measuring the rate"
	}
	perSec := float64(last.v-from.v) / el.Seconds()
	switch {
	case left <= 0:
		return fmt.Sprintf("%s tasks/s", rateString(perSec))
	case perSec <= 0:
		return "0 tasks/s, ETA unknown"
	}
	eta := time.Duration(float64(left) / perSec * float64(time.Second))
	return fmt.Sprintf("%s tasks/s, ETA %s", rateString(perSec), etaString(eta))
}

// rateString prints a rate with the digits that matter, in 5 characters
// or fewer up to 9.9 million.
func rateString(r float64) string {
	switch {
	case r >= 100000:
		return fmt.Sprintf("%.0fk", r/1000)
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

// etaString prints the time left to the second under an hour and to the
// minute from an hour on, where the seconds are noise: 6 characters or
// fewer under 100 h.
func etaString(d time.Duration) string {
	if d < time.Hour {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// addBaseline counts n tasks that had ended before this run: they move
// the bar (addCompleted) but not the rate.
func (p *progress) addBaseline(n int) {
	if p != nil && n > 0 {
		p.baseline.Add(int64(n))
	}
}

// loop redraws a few times a second, so the bar moves (ease) and the rate
// and ETA follow even while counts arrive in batch-sized steps.
func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.redraw(now)
		}
	}
}

// redraw moves the value drawn a step toward the counts and draws the
// bar as of now.
func (p *progress) redraw(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar.IsFinished() {
		return // its line is ended: a draw would repeat it below
	}
	p.ease()
	p.draw(now)
}

// draw draws the description and the value in one line. Describe draws
// at once, and so does Set64 when the value moves the bar, so the
// description is set undrawn first (an Option is a setter on the bar),
// and drawn by Describe only when Set64 drew nothing; after a value that
// fills the bar, which ends its line, Describe would draw it anew on the
// next. Called with mu held.
func (p *progress) draw(now time.Time) {
	d := p.describe(now)
	progressbar.OptionSetDescription(d)(p.bar)
	drawn := p.bar.String()
	_ = p.bar.Set64(p.shown)
	if p.bar.String() == drawn && !p.bar.IsFinished() {
		p.bar.Describe(d)
	}
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
	p.last(time.Now())
}

// last draws the exact counts, not one eased toward them, and ends the
// bar's line.
func (p *progress) last(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar.IsFinished() {
		return // it was drawn full, which ended its line
	}
	p.shown, p.step = p.value(), 0
	p.draw(now)
	if !p.bar.IsFinished() {
		_ = p.bar.Exit() // its completion hook ends the line
	}
}
