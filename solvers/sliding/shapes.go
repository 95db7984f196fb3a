package sliding

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// shapePDBs holds the pattern databases of one searched shape, in the
// orientation with rows <= cols (a board with more rows than columns is
// solved transposed). They are built or loaded once, in the background:
// the first caller starts the work and every caller, the first included,
// waits for it or for its own ctx, so a cancelled Solve returns at once
// and the finished databases are still kept for the next query.
type shapePDBs struct {
	rows, cols int
	groups     [][]uint8 // partition of the tiles 1..n-1
	reflect    bool      // square: also look up the reflected board

	once  sync.Once
	done  chan struct{}
	h     *heuristic
	err   error      // from loading or saving files; h is valid anyway
	mu    sync.Mutex // guards saved
	saved string     // directory the files are known to be in
}

// searchShapes lists the partitions of every shape solved by IDA*, with
// rows <= cols. Groups are compact blocks of goal cells. Only 4×4, the
// shape that matters most, gets six-tile groups (16!/10! = 5.8 M entries
// each, several seconds to build); 3×4 and 2×6 have few enough cells for
// a 6-5 split, the 14- to 16-cell rectangles use five-tile groups, which
// build in well under a second and hold 0.5 M entries at most:
//
//	4×4: {1,5,6,9,10,13} {7,8,11,12,14,15} {2,3,4}  (Korf & Felner's 6-6-3)
//	3×5: {1,2,6,7,11} {3,4,8,12,13} {5,9,10,14}
//	3×4: {1,2,5,6,9,10} {3,4,7,8,11}
//	2×8: {1,2,3,9,10} {4,5,11,12,13} {6,7,8,14,15}
//	2×7: {1,2,3,8,9} {4,5,10,11,12} {6,7,13}
//	2×6: {1,2,3,7,8,9} {4,5,6,10,11}
//	2×5: {1,2,3,6,7} {4,5,8,9}
var searchShapes = []*shapePDBs{
	{rows: 4, cols: 4, reflect: true, groups: [][]uint8{{1, 5, 6, 9, 10, 13}, {7, 8, 11, 12, 14, 15}, {2, 3, 4}}},
	{rows: 3, cols: 5, groups: [][]uint8{{1, 2, 6, 7, 11}, {3, 4, 8, 12, 13}, {5, 9, 10, 14}}},
	{rows: 3, cols: 4, groups: [][]uint8{{1, 2, 5, 6, 9, 10}, {3, 4, 7, 8, 11}}},
	{rows: 2, cols: 8, groups: [][]uint8{{1, 2, 3, 9, 10}, {4, 5, 11, 12, 13}, {6, 7, 8, 14, 15}}},
	{rows: 2, cols: 7, groups: [][]uint8{{1, 2, 3, 8, 9}, {4, 5, 10, 11, 12}, {6, 7, 13}}},
	{rows: 2, cols: 6, groups: [][]uint8{{1, 2, 3, 7, 8, 9}, {4, 5, 6, 10, 11}}},
	{rows: 2, cols: 5, groups: [][]uint8{{1, 2, 3, 6, 7}, {4, 5, 8, 9}}},
}

func init() {
	// The channels exist before any goroutine can look at them, so that
	// PDBMemory may poll them while a build is being started.
	for _, s := range searchShapes {
		s.done = make(chan struct{})
	}
}

// shapeFor returns the entry of a searched shape with rows <= cols, or nil.
func shapeFor(rows, cols int) *shapePDBs {
	for _, s := range searchShapes {
		if s.rows == rows && s.cols == cols {
			return s
		}
	}
	return nil
}

// buildSlots limits database builds to one at a time, so that concurrent
// first queries of several shapes do not hold the scratch memory of many
// builds at once. A six-tile build on 16 cells needs 14.4 MB of marks
// besides its 2.9 MB result. One slot keeps the peak of a process that
// builds every database low (see TestPreload's log); two would build the
// 4×4 pair in half the wall time on two idle cores, at about 18 MB more.
var buildSlots = make(chan struct{}, 1)

// start begins loading (from dir, when not empty) or building the
// databases, once per process.
func (s *shapePDBs) start(dir string) {
	s.once.Do(func() {
		go func() {
			defer close(s.done)
			groups := make([]*pdb, len(s.groups))
			errs := make([]error, len(s.groups))
			var wg sync.WaitGroup
			for i, tiles := range s.groups {
				wg.Go(func() { groups[i], errs[i] = loadOrBuild(dir, s.rows, s.cols, tiles) })
			}
			wg.Wait()
			s.h = newHeuristic(s.rows, s.cols, groups, s.reflect)
			s.err = errors.Join(errs...)
			if s.err == nil && dir != "" {
				s.saved = dir
			}
		}()
	})
}

// wait returns the heuristic once it is ready, or ctx.Err().
func (s *shapePDBs) wait(ctx context.Context) (*heuristic, error) {
	select {
	case <-s.done:
		return s.h, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// cacheDir is the directory UseCacheDir set; "" for none.
var cacheDir atomic.Pointer[string]

// UseCacheDir makes Solve keep the pattern databases in dir (which must
// exist): a shape's first query in the process reads them from their
// files there when they are intact, and builds and writes them when not.
// A short-lived process that solves a 15-puzzle (puzzlectl solve --local)
// thus pays the build (about 6.5 s of CPU for 4×4) once, not every run.
// "" keeps them in memory only, the default.
func UseCacheDir(dir string) { cacheDir.Store(&dir) }

// heuristicFor returns the heuristic of a searched shape (rows <= cols),
// loading or building it on first use (see UseCacheDir).
func heuristicFor(ctx context.Context, rows, cols int) (*heuristic, error) {
	if rows == 4 && cols == 4 {
		if h := mapped78.Load(); h != nil {
			return h, nil
		}
	}
	s := shapeFor(rows, cols)
	dir := ""
	if d := cacheDir.Load(); d != nil {
		dir = *d
	}
	s.start(dir)
	h, err := s.wait(ctx)
	if err == nil && dir != "" && s.err == nil {
		// Built in memory before the directory was set: save it now.
		_ = s.save(dir, h)
	}
	return h, err
}

// save writes the shape's databases to dir unless they are known to be
// there, and remembers that they are.
func (s *shapePDBs) save(dir string, h *heuristic) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.saved == dir {
		return nil
	}
	var werr error
	for _, p := range h.groups {
		if _, ok := readPDB(dir, p.rows, p.cols, p.tiles); !ok {
			werr = errors.Join(werr, writePDB(dir, p))
		}
	}
	if werr == nil {
		s.saved = dir
	}
	return werr
}

// Preload makes the pattern databases of every shape solved by search
// (4×4, 3×5, 3×4, 2×5 to 2×8 and their transposes) ready, so that the
// first query of a shape does not pay for the build. With dir == "" they
// are built in memory. Otherwise each database is read from its file in
// dir when the file is intact (its SHA-256 matches), and built and written
// (atomically: temporary file, then rename) when it is missing or damaged;
// dir must exist. Databases that Solve already built in memory are written
// to dir as well. Preload is safe for concurrent use with itself and with
// Solve; it returns ctx.Err() if ctx ends first (the work goes on in the
// background) and the I/O errors met, in which case the databases are
// still usable in memory.
//
// When UseTables has mapped the 7-8 tables, 4×4's 6-6-3 databases are
// skipped (built on first use if UseTables(dir, Set663) is called later).
//
// Building everything takes about 9 s of CPU (6.5 s of it for the two
// six-tile 4×4 databases), loading it from files a
// few tens of milliseconds; PDBMemory reports the memory held (7.6 MiB).
func Preload(ctx context.Context, dir string) error {
	var errs []error
	for _, s := range searchShapes {
		if err := ctx.Err(); err != nil {
			return err // start nothing more
		}
		if s.rows == 4 && s.cols == 4 && mapped78.Load() != nil {
			continue // 4×4 uses the mapped 7-8 tables
		}
		s.start(dir)
		h, err := s.wait(ctx)
		if err != nil {
			return err
		}
		if s.err != nil {
			errs = append(errs, s.err)
			continue
		}
		if dir == "" {
			continue
		}
		errs = append(errs, s.save(dir, h))
	}
	return errors.Join(errs...)
}

// pdbMemoryTotal is what PDBMemory returns once every shape is ready.
const pdbMemoryTotal = 7949712

// PDBMemory returns the bytes held by the pattern databases built or loaded
// so far: 7,949,712 bytes (7.6 MiB) once every shape is ready, of which
// 4×4 holds 5,767,440 (four bits per entry). A build needs 2 bits of
// scratch per state besides (14.4 MB for a six-tile database on 16
// cells), one build at a time.
func PDBMemory() int64 {
	var m int64
	for _, s := range searchShapes {
		select {
		case <-s.done:
			m += s.h.memory()
		default:
		}
	}
	return m
}

// loadOrBuild returns the database of the pattern tiles on an R×C board:
// read from dir when its file there is intact, else built, and then
// written to dir when dir is not empty. The error reports a failed write;
// the database is valid regardless.
func loadOrBuild(dir string, rows, cols int, tiles []uint8) (*pdb, error) {
	if dir != "" {
		if p, ok := readPDB(dir, rows, cols, tiles); ok {
			return p, nil
		}
	}
	buildSlots <- struct{}{}
	p, err := buildPDB(context.Background(), rows, cols, tiles)
	<-buildSlots
	if err != nil {
		panic(err) // cannot happen: the context is never cancelled
	}
	if dir != "" {
		return p, writePDB(dir, p)
	}
	return p, nil
}

// manhattanHeuristic returns the Manhattan distance as a heuristic of the
// same kind: one single-tile database per tile (a lone tile needs exactly
// its Manhattan distance in moves), marked so that idaStar searches it
// with idaStarManhattan. It is not used by Solve; the tests and
// benchmarks compare it with the pattern databases and with other
// programs' Manhattan-distance searches.
func manhattanHeuristic(rows, cols int) *heuristic {
	n := rows * cols
	groups := make([]*pdb, 0, n-1)
	for t := 1; t < n; t++ {
		p, _ := buildPDB(context.Background(), rows, cols, []uint8{uint8(t)})
		groups = append(groups, p)
	}
	h := newHeuristic(rows, cols, groups, false)
	h.manhattan = true
	return h
}
