package sliding

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// TableSet names the pattern databases that solve 4×4 boards.
type TableSet string

const (
	// Set663 is the 6-6-3 partition (see searchShapes): 5.8 MB, built
	// in seconds on first use or loaded from a cache directory. It is the
	// small-memory choice and what 4×4 falls back to when the 7-8 files are
	// missing.
	Set663 TableSet = "663"
	// Set78 is Korf and Felner's 7-8 partition: the tiles of the top two
	// rows {1..8} in one database (16!/8! = 518,918,400 entries, 259 MB at
	// four bits each) and the rest {9..15} in the other (57,657,600
	// entries, 29 MB), with the reflected lookup. It is far too slow to
	// build on a query (minutes of CPU and 1.3 GB of scratch), so it is
	// built once by BuildTables into a directory and memory-mapped from
	// there by UseTables: every process on a host shares one copy through
	// the page cache, and a process start costs a few system calls.
	Set78 TableSet = "78"
)

// ParseTableSet accepts "663" and "78".
func ParseTableSet(s string) (TableSet, error) {
	switch TableSet(s) {
	case Set663, Set78:
		return TableSet(s), nil
	}
	return "", fmt.Errorf("sliding: unknown table set %q (want 663 or 78)", s)
}

// set78Groups is the 7-8 partition in our goal convention (blank last).
// Korf and Felner put the blank first and the tiles 1..7 next to it, 8..15
// in the two far rows; turned by 180° into our convention those are the
// tiles 9..15 and 1..8.
var set78Groups = [][]uint8{{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15}}

// groupsOf returns the 4×4 partition of a set.
func groupsOf(set TableSet) [][]uint8 {
	if set == Set78 {
		return set78Groups
	}
	return shapeFor(4, 4).groups
}

// TableFile describes one database file of a set.
type TableFile struct {
	Name  string        // file name in the directory
	Bytes int64         // file size
	Built bool          // built by this call (BuildTables)
	Took  time.Duration // build or check time
	Err   error         // missing, damaged or unwritable; nil when intact
}

// BuildTables makes dir (which must exist) hold intact files of every
// 4×4 database of set: a file that is already there and verifies is kept,
// the others are built and written atomically. Each finished file is
// passed to report (which may be nil) as it completes. Building Set78
// takes minutes of CPU and about 1.3 GB of memory for the 8-tile database
// (two bits of scratch per placement and blank cell: 16!/8! × 8 states);
// ctx is polled between BFS levels.
func BuildTables(ctx context.Context, dir string, set TableSet, report func(TableFile)) ([]TableFile, error) {
	var out []TableFile
	for _, tiles := range groupsOf(set) {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		t0 := time.Now()
		f := TableFile{Name: pdbFileName(4, 4, tiles)}
		if _, err := verifyFile(dir, 4, 4, tiles); err == nil {
			f.Took = time.Since(t0)
		} else {
			p, err := buildPDB(ctx, 4, 4, tiles)
			if err != nil {
				return out, err
			}
			f.Built = true
			f.Err = writePDB(dir, p)
			f.Took = time.Since(t0)
		}
		if st, err := os.Stat(filepath.Join(dir, f.Name)); err == nil {
			f.Bytes = st.Size()
		}
		out = append(out, f)
		if report != nil {
			report(f)
		}
		if f.Err != nil {
			return out, f.Err
		}
	}
	return out, nil
}

// VerifyTables checks every 4×4 database file of set in dir: header, size
// and SHA-256 of the entries. The error joins the faults found.
func VerifyTables(dir string, set TableSet) ([]TableFile, error) {
	var out []TableFile
	var errs []error
	for _, tiles := range groupsOf(set) {
		t0 := time.Now()
		n, err := verifyFile(dir, 4, 4, tiles)
		out = append(out, TableFile{Name: pdbFileName(4, 4, tiles), Bytes: n, Took: time.Since(t0), Err: err})
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// verifyFile checks one database file by streaming it through SHA-256
// (the 8-tile file is 259 MB: no need to hold it), returning its size.
func verifyFile(dir string, rows, cols int, tiles []uint8) (int64, error) {
	name := filepath.Join(dir, pdbFileName(rows, cols, tiles))
	f, err := os.Open(name)
	if err != nil {
		return 0, fmt.Errorf("sliding: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("sliding: %w", err)
	}
	count := permCount(rows*cols, len(tiles))
	head := pdbHeader(rows, cols, tiles, count)
	want := int64(len(head) + sha256.Size + nibbleBytes(count))
	if st.Size() != want {
		return st.Size(), fmt.Errorf("sliding: %s: %d bytes, want %d", name, st.Size(), want)
	}
	buf := make([]byte, len(head)+sha256.Size)
	if _, err := io.ReadFull(f, buf); err != nil {
		return st.Size(), fmt.Errorf("sliding: %s: %w", name, err)
	}
	if !bytes.Equal(buf[:len(head)], head) {
		return st.Size(), fmt.Errorf("sliding: %s: header does not match", name)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return st.Size(), fmt.Errorf("sliding: %s: %w", name, err)
	}
	if !bytes.Equal(h.Sum(nil), buf[len(head):]) {
		return st.Size(), fmt.Errorf("sliding: %s: checksum does not match", name)
	}
	return st.Size(), nil
}

// mapped78 is the 7-8 heuristic in use, nil while 4×4 uses 6-6-3.
var mapped78 atomic.Pointer[heuristic]

// ErrTablesMissing means a table set's files are absent or damaged in
// the directory given to UseTables.
var ErrTablesMissing = errors.New("pattern database files missing or damaged")

// UseTables selects the databases that solve 4×4 boards. Set78 maps its
// files from dir read-only; when they are missing or their headers or
// sizes are wrong it returns an error wrapping ErrTablesMissing and 4×4
// keeps (or returns to) 6-6-3. The mapping checks no checksum, which
// would read all 288 MB: VerifyTables does, once, where the files are
// built. Set663 drops a mapped 7-8 set (its mapping is left in place, as
// searches may still read it). Safe for concurrent use with Solve; a
// search keeps the heuristic it started with.
func UseTables(dir string, set TableSet) error {
	if set != Set78 {
		mapped78.Store(nil)
		return nil
	}
	groups := make([]*pdb, 0, len(set78Groups))
	for _, tiles := range set78Groups {
		p, err := mapPDB(dir, 4, 4, tiles)
		if err != nil {
			mapped78.Store(nil)
			return fmt.Errorf("sliding: 7-8 tables in %q: %w: %w", dir, ErrTablesMissing, err)
		}
		groups = append(groups, p)
	}
	mapped78.Store(newHeuristic(4, 4, groups, true))
	return nil
}

// ActiveTables reports the set that solves 4×4 boards now.
func ActiveTables() TableSet {
	if mapped78.Load() != nil {
		return Set78
	}
	return Set663
}

// MappedBytes returns the size of the mapped 7-8 databases (0 when 4×4
// uses 6-6-3). They live in the page cache, shared by every process that
// maps them, and count toward a process's resident memory only as far as
// its searches have touched them.
func MappedBytes() int64 {
	if h := mapped78.Load(); h != nil {
		return h.memory()
	}
	return 0
}

// mapPDB maps the database of the pattern tiles from its file in dir,
// after checking its header and size, and checks that the goal's entry is
// 0 (a cheap guard against a file of the right size and wrong content).
func mapPDB(dir string, rows, cols int, tiles []uint8) (*pdb, error) {
	name := filepath.Join(dir, pdbFileName(rows, cols, tiles))
	count := permCount(rows*cols, len(tiles))
	head := pdbHeader(rows, cols, tiles, count)
	off := len(head) + sha256.Size
	raw, err := mapFile(name, off+nibbleBytes(count))
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(raw[:len(head)], head) {
		unmapFile(raw)
		return nil, fmt.Errorf("%s: header does not match", name)
	}
	p := &pdb{rows: rows, cols: cols, n: rows * cols, tiles: append([]uint8(nil), tiles...), data: raw[off:], mapped: raw}
	goal := make([]uint8, len(tiles))
	for i, t := range tiles {
		goal[i] = t - 1
	}
	if p.entry(rankCells(goal, p.n)) != 0 {
		unmapFile(raw)
		return nil, fmt.Errorf("%s: goal entry is not 0", name)
	}
	return p, nil
}
