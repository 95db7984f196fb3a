package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/puzzleq/puzzleq/puzzle"
)

// validateBlock is how many lines a validator takes at a time: large
// enough that handing out blocks costs nothing, small enough that the
// upload, which waits for each line's block, starts at once.
const validateBlock = 512

// errInvalidInput ends an upload whose input has a bad line: the body's
// reader returns it before the body's last byte, so the server, which
// reads the declared length before it accepts anything, discards what it
// staged. The error the user sees is validation.err, not this.
var errInvalidInput = errors.New("the input has a bad line: upload cut short")

// validation checks a run's lines as the API would (decodeItem, and
// custom_id unique in the input) on every core, while the lines are
// uploaded: each line is released to the body once it and every line
// before it passed, and a batch's last byte only once every line of the
// input passed (final), so that a bad line leaves nothing accepted however
// far the upload got.
type validation struct {
	items []item
	// released counts the lines, from the first, that passed, custom_id
	// uniqueness included; advanced by the sequencer only.
	released atomic.Int64
	// moved is closed and replaced (under mu) whenever released grows or
	// the validation ends, waking the readers that wait on it.
	mu    sync.Mutex
	moved chan struct{}
	done  chan struct{} // closed when every line passed or one failed
	err   error         // the first bad line, as readItems words it; set before done

	// ready runs once, after every line passed and before any batch's
	// last byte goes (opening --out, say); its error fails the run like
	// a bad line.
	ready     func() error
	readyMu   sync.Mutex
	readyDone bool // ready ran, or must not run now (settle)
	readyErr  error
}

// splitLines reads the input and cuts it into its non-blank lines,
// unvalidated. A line over maxJSONLine is an error at once: it is
// reported before any line's content, as readItems did.
func splitLines(in io.Reader) ([]item, error) {
	data, err := io.ReadAll(in)
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	items := make([]item, 0, bytes.Count(data, []byte{'\n'})+1)
	line := 0
	for len(data) > 0 {
		line++
		l, rest, _ := bytes.Cut(data, []byte{'\n'})
		data = rest
		if len(l) > maxJSONLine {
			return nil, usagef("line %d: longer than %d bytes", line, maxJSONLine)
		}
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		items = append(items, item{line: line, raw: l})
	}
	return items, nil
}

// startValidation validates items in the background; see validation.
func startValidation(items []item, ready func() error) *validation {
	v := &validation{items: items, moved: make(chan struct{}), done: make(chan struct{}), ready: ready}
	blocks := (len(items) + validateBlock - 1) / validateBlock
	passed := make([]chan struct{}, blocks)
	for i := range passed {
		passed[i] = make(chan struct{})
	}
	var (
		next     atomic.Int64
		failOnce sync.Once
		failed   = make(chan struct{})
		workers  sync.WaitGroup
	)
	stop := func() { failOnce.Do(func() { close(failed) }) }
	for range min(runtime.GOMAXPROCS(0), max(blocks, 1)) {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				b := int(next.Add(1) - 1)
				if b >= blocks {
					return
				}
				select {
				case <-failed:
					return
				default:
				}
				lo, hi := b*validateBlock, min((b+1)*validateBlock, len(items))
				for i := lo; i < hi; i++ {
					j := &items[i]
					var err error
					if j.customID, j.hasCustomID, err = decodeItem(j.raw); err != nil {
						stop()
						return // the sequencer never sees this block pass
					}
				}
				close(passed[b])
			}
		}()
	}
	// The sequencer releases blocks in order, checking custom_id
	// uniqueness as it goes.
	go func() {
		defer close(v.done)
		fail := func() {
			stop()
			workers.Wait() // they write the items validateAll writes
			v.fail()
		}
		seen := puzzle.CustomIDs{}
		for b := range blocks {
			select {
			case <-passed[b]:
			case <-failed:
				fail()
				return
			}
			lo, hi := b*validateBlock, min((b+1)*validateBlock, len(items))
			for i := lo; i < hi; i++ {
				j := &items[i]
				if j.hasCustomID && seen.Add(j.customID, j.line) != nil {
					fail()
					return
				}
			}
			v.release(int64(hi))
		}
	}()
	return v
}

// release moves the released mark to n lines and wakes the readers.
func (v *validation) release(n int64) {
	v.mu.Lock()
	v.released.Store(n)
	close(v.moved)
	v.moved = make(chan struct{})
	v.mu.Unlock()
}

// fail sets err to the error readItems gives for the input: a line failed,
// so validating it all again (the error path only) finds the same first
// bad line by the same rules.
func (v *validation) fail() {
	v.err = validateAll(v.items)
	if v.err == nil {
		v.err = errors.New("puzzlectl: the input failed validation, and then passed it")
	}
	v.mu.Lock()
	close(v.moved)
	v.moved = make(chan struct{})
	v.mu.Unlock()
}

// waitLine blocks until line index i (0-based, of items) passed, or the
// validation failed.
func (v *validation) waitLine(i int) error {
	for int64(i) >= v.released.Load() {
		v.mu.Lock()
		moved := v.moved
		v.mu.Unlock()
		if int64(i) < v.released.Load() {
			break
		}
		select {
		case <-moved:
		case <-v.done:
			if v.err != nil {
				return errInvalidInput
			}
		}
	}
	return nil
}

// final blocks until every line passed, then runs ready once; nil means
// a batch may send its last byte.
func (v *validation) final() error {
	if err := v.wait(); err != nil {
		return errInvalidInput
	}
	v.readyMu.Lock()
	defer v.readyMu.Unlock()
	if !v.readyDone {
		v.readyDone = true
		if v.ready != nil {
			v.readyErr = v.ready()
		}
	}
	if v.readyErr != nil {
		return errInvalidInput
	}
	return nil
}

// settle ends the gate's part in a run that has ended: ready runs no
// more, and what it did (from whichever goroutine) is seen by the
// caller.
func (v *validation) settle() {
	v.readyMu.Lock()
	v.readyDone = true
	v.readyMu.Unlock()
}

// wait blocks until the validation ended and returns its error.
func (v *validation) wait() error {
	<-v.done
	return v.err
}

// failure is the error that ended the run early, if validation or ready
// did: it is what the user must see, whatever the upload made of it.
func (v *validation) failure() error {
	if v == nil {
		return nil
	}
	select {
	case <-v.done:
	default:
		return nil
	}
	if v.err != nil {
		return v.err
	}
	v.readyMu.Lock()
	defer v.readyMu.Unlock()
	return v.readyErr
}

// validateAll validates every item as readItems did: decodeItem in
// parallel, the first bad line by number; then custom_id uniqueness.
func validateAll(items []item) error {
	workers := min(runtime.GOMAXPROCS(0), max(len(items)/512, 1))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	per := (len(items) + workers - 1) / workers
	for w := range workers {
		lo, hi := w*per, min((w+1)*per, len(items))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				j := &items[i]
				var err error
				if j.customID, j.hasCustomID, err = decodeItem(j.raw); err != nil {
					errs[w] = puzzle.LineError(err, j.line)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := firstNonNil(errs); err != nil {
		return err
	}
	// custom_id is unique within a batch; puzzlectl holds the whole input
	// to it, so that a result names one line whatever the batches.
	seen := puzzle.CustomIDs{}
	for _, j := range items {
		if !j.hasCustomID {
			continue
		}
		if err := seen.Add(j.customID, j.line); err != nil {
			return err
		}
	}
	return nil
}
