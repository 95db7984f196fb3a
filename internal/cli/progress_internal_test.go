package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestRateFromTheFirstSecondAndAfterAResume: the rate is this run's own
// pace, measured from the first second, and a resumed run's earlier work
// (the baseline) does not count as done in an instant.
func TestRateFromTheFirstSecondAndAfterAResume(t *testing.T) {
	t0 := time.Now()
	p := &progress{total: 10000, wait: true, start: t0}
	if got := p.rateText(t0.Add(300 * time.Millisecond)); got != "measuring the rate" {
		t.Fatalf("at 0.3 s: %q", got)
	}
	p.completed.Store(100)
	if got := p.rateText(t0.Add(time.Second)); got != "100 tasks/s, ETA 1m39s" {
		t.Fatalf("100 tasks in the first second: %q", got)
	}

	// Resumed: 6,000 of 10,000 had ended before; 50 more in 2 s.
	r := &progress{total: 10000, wait: true, start: t0}
	r.addBaseline(6000)
	r.completed.Store(6000)
	r.rateText(t0.Add(500 * time.Millisecond))
	r.completed.Store(6050)
	got := r.rateText(t0.Add(2 * time.Second))
	if !strings.HasPrefix(got, "25.0 tasks/s") || !strings.Contains(got, "ETA 2m38s") {
		t.Fatalf("a resumed run: %q, want 25 tasks/s and 3,950 left at that pace", got)
	}
	// Past the window, the rate follows the recent pace.
	for i := 3; i <= 30; i++ {
		r.completed.Add(10)
		got = r.rateText(t0.Add(time.Duration(i) * time.Second))
	}
	if !strings.HasPrefix(got, "10.0 tasks/s") {
		t.Fatalf("after 30 s at 10 tasks/s: %q", got)
	}
	// Stalled: no ETA rather than 0 s.
	s := &progress{total: 10, wait: true, start: t0}
	if got := s.rateText(t0.Add(2 * time.Second)); got != "0 tasks/s, ETA unknown" {
		t.Fatalf("nothing done: %q", got)
	}
}

// frames are the lines a bar drew on out, in order: each draw starts with
// a carriage return, and a clear (spaces over the last line) is not one.
func frames(out string) []string {
	var fs []string
	for _, f := range strings.Split(out, "\r") {
		f = strings.TrimSuffix(f, "\n")
		if strings.TrimSpace(f) != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// t0 is the start of the test bars' clock.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testBar is a bar of total tasks drawn into out from t0, with every
// task submitted when it waits for completions.
func testBar(out *bytes.Buffer, total int, wait bool) *progress {
	p := newBar(out, total, wait, t0)
	if wait {
		p.submitted.Store(int64(total))
	}
	return p
}

// lastFrame is the last line drawn into out.
func lastFrame(out *bytes.Buffer) string {
	fs := frames(out.String())
	return fs[len(fs)-1]
}

// TestProgressLineKeepsItsWidth draws bars through all their states (the
// first second, steady chunks, a burst, a stall, the end) and checks that
// every line drawn has one width: the counts, the rate and the ETA grow
// and shrink inside it.
func TestProgressLineKeepsItsWidth(t *testing.T) {
	for _, total := range []int{7, 5000, 123456} {
		for _, wait := range []bool{true, false} {
			var out bytes.Buffer
			p := newBar(&out, total, wait, t0)
			counts := &p.completed
			if !wait {
				counts = &p.submitted
			}
			now := t0
			second := int(time.Second / tick) // redraws
			redraw := func(n int) {
				for range n {
					now = now.Add(tick)
					p.redraw(now)
				}
			}
			redraw(3) // measuring the rate
			chunk := int64(max(1, total/40))
			for counts.Load()+chunk < int64(total)*3/4 { // steady chunks, one a second
				counts.Add(chunk)
				if wait {
					p.submitted.Store(int64(total))
				}
				redraw(second)
			}
			redraw(20 * second) // a stall: 0 tasks/s, ETA unknown
			counts.Add(1)
			redraw(1) // a slow pace: the longest ETA
			counts.Store(int64(total) - 1)
			redraw(second + 1) // a burst
			counts.Store(int64(total))
			redraw(2)
			p.last(now)

			fs := frames(out.String())
			if len(fs) < 20 {
				t.Fatalf("total %d, wait %v: %d lines drawn: %q", total, wait, len(fs), out.String())
			}
			want := utf8.RuneCountInString(fs[0])
			for i, f := range fs {
				if n := utf8.RuneCountInString(f); n != want {
					t.Errorf("total %d, wait %v: line %d is %d wide, the first %d:\n%q\n%q", total, wait, i, n, want, fs[0], f)
				}
			}
			full := fmt.Sprintf("%d/%d", total, total)
			if last := fs[len(fs)-1]; !strings.Contains(last, "100%") || !strings.Contains(last, full) || !strings.HasSuffix(out.String(), "\n") {
				t.Errorf("total %d, wait %v: the last line %q, want 100%% and %s, ended", total, wait, last, full)
			}
		}
	}
}

// TestProgressEasesAJump: a chunk of 512 results arriving at once moves
// the bar in steps over the next redraws, up to the exact count; the end
// of a run draws the exact count however far behind the bar was.
func TestProgressEasesAJump(t *testing.T) {
	var out bytes.Buffer
	p := testBar(&out, 5000, true)
	now := t0
	count := regexp.MustCompile(`(\d+)/5000`) // the first on the line is the value drawn
	shown := func() int {
		f := lastFrame(&out)
		m := count.FindStringSubmatch(f)
		if m == nil {
			t.Fatalf("no count in %q", f)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	redraw := func() int {
		now = now.Add(tick)
		p.redraw(now)
		return shown()
	}
	redraw()
	p.completed.Add(512)
	var seen []int
	for range easeTicks {
		seen = append(seen, redraw())
	}
	if seen[len(seen)-1] != 512 {
		t.Fatalf("after %d redraws: %v, want 512 reached", easeTicks, seen)
	}
	steps := 0
	for i, n := range seen {
		if i > 0 && n < seen[i-1] {
			t.Fatalf("the bar went back: %v", seen)
		}
		if n > 0 && n < 512 {
			steps++
		}
	}
	if steps < 3 {
		t.Fatalf("the jump of 512 was drawn as %v: want at least 3 steps short of it", seen)
	}
	if n := redraw(); n != 512 {
		t.Fatalf("after reaching 512: %d", n)
	}

	// A chunk while the last is drawn can only hurry the bar: each is
	// drawn within easeTicks redraws of its arrival.
	p.completed.Add(512)
	redraw()
	p.completed.Add(512)
	for range easeTicks - 2 {
		redraw()
	}
	if n := redraw(); n < 1024 {
		t.Fatalf("a chunk to 1024, then one to 1536: %d drawn %d redraws after the first, want 1024 or more", n, easeTicks)
	}
	if n := redraw(); n != 1536 {
		t.Fatalf("a chunk to 1024, then one to 1536: %d drawn %d redraws after the second, want 1536", n, easeTicks)
	}
	// A small chunk while a big one is drawn does not slow the step, so
	// the big one is still drawn in easeTicks redraws.
	p.completed.Add(512)
	redraw()
	p.completed.Add(1)
	for range easeTicks - 2 {
		redraw()
	}
	if n := redraw(); n != 2049 {
		t.Fatalf("a chunk to 2048, then one of 1: %d drawn %d redraws after the first, want 2049", n, easeTicks)
	}

	// The run ends mid-step: the last line is exact.
	p.completed.Store(5000)
	if n := redraw(); n >= 5000 {
		t.Fatalf("a jump to the end drawn at once: %d", n)
	}
	p.last(now)
	if n := shown(); n != 5000 || !strings.Contains(out.String(), "100%") || !strings.HasSuffix(out.String(), "\n") {
		t.Fatalf("the last line: %q", lastFrame(&out))
	}
	// Nothing is drawn after the line ended.
	before := out.Len()
	p.redraw(now.Add(tick))
	p.last(now.Add(2 * tick))
	if out.Len() != before {
		t.Errorf("drawn after the end: %q", out.String()[before:])
	}
}

// TestProgressRateHoldsBetweenChunks: results arriving 512 at a time, one
// chunk a second, are a pace of 512 tasks/s at every redraw, not a rate
// that sinks between chunks and leaps at each; when they stop, the rate
// falls.
func TestProgressRateHoldsBetweenChunks(t *testing.T) {
	var out bytes.Buffer
	p := testBar(&out, 20000, true)
	now := t0
	rate := regexp.MustCompile(`; (\S+) tasks/s`)
	second := int(time.Second / tick) // redraws
	var rates []string
	for s := 1; s <= 15; s++ {
		for i := range second {
			now = now.Add(tick)
			if i == second-1 {
				p.completed.Add(512)
			}
			p.redraw(now)
			if m := rate.FindStringSubmatch(lastFrame(&out)); m != nil {
				rates = append(rates, m[1])
			} else if s > 1 {
				t.Fatalf("at %s: no rate in %q", now.Sub(t0), lastFrame(&out))
			}
		}
	}
	for i, r := range rates {
		if r != "512" {
			t.Fatalf("redraw %d: %s tasks/s, want 512 at each (all: %v)", i, r, rates)
		}
	}
	// A stall: the rate falls once the next chunk is overdue.
	for range 2 * second {
		now = now.Add(tick)
		p.redraw(now)
	}
	if f := lastFrame(&out); rate.FindStringSubmatch(f) == nil || rate.FindStringSubmatch(f)[1] == "512" {
		t.Errorf("after 2 s without results: %q, want a lower rate", f)
	}
}

// TestRateAndETAFitTheirField: the rate and the ETA print short enough
// for rateWidth, at paces and times left from the slowest to the fastest
// a run sees.
func TestRateAndETAFitTheirField(t *testing.T) {
	for _, c := range []struct {
		rate float64
		eta  time.Duration
		want string
	}{
		{0.004, 99*time.Hour + 59*time.Minute + 29*time.Second, "0.00 tasks/s, ETA 99h59m"},
		{25, 2*time.Minute + 38*time.Second, "25.0 tasks/s, ETA 2m38s"},
		{512, 59*time.Minute + 59*time.Second, "512 tasks/s, ETA 59m59s"},
		{99999, 3*time.Hour + 26*time.Minute + 26*time.Second, "99999 tasks/s, ETA 3h26m"},
		{123456, time.Hour, "123k tasks/s, ETA 1h0m"},
		{9.9e6, 1500 * time.Millisecond, "9900k tasks/s, ETA 2s"},
	} {
		got := fmt.Sprintf("%s tasks/s, ETA %s", rateString(c.rate), etaString(c.eta))
		if got != c.want {
			t.Errorf("%v tasks/s, %v left: %q, want %q", c.rate, c.eta, got, c.want)
		}
		if len(got) > rateWidth {
			t.Errorf("%q is wider than the field (%d)", got, rateWidth)
		}
	}
}

// TestNoBarOffATerminal: a buffer or a file is not a terminal, so nothing
// is drawn on it.
func TestNoBarOffATerminal(t *testing.T) {
	var buf bytes.Buffer
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []io.Writer{&buf, f} {
		p := newProgress(w, 100, true)
		if p != nil {
			t.Fatalf("a bar on %T", w)
		}
		p.addSubmitted(100)
		p.addCompleted(100)
		p.finish()
	}
	if st, _ := f.Stat(); buf.Len() != 0 || st.Size() != 0 {
		t.Errorf("drawn off a terminal: %q, %d bytes in the file", buf.String(), st.Size())
	}
}
