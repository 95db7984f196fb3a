package sliding

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// pdb78Dir names the directory holding the built 7-8 files (puzzlectl pdb
// build DIR --set 78); the tests that need them skip without it, so that
// go test never builds a 288 MB table.
func pdb78Dir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("PUZZLEQ_PDB78_DIR")
	if dir == "" {
		tb.Skip("set PUZZLEQ_PDB78_DIR to a directory built by puzzlectl pdb build --set 78")
	}
	return dir
}

// use78 maps the 7-8 files for the test and restores 6-6-3 after it.
func use78(tb testing.TB) *heuristic {
	tb.Helper()
	if err := UseTables(pdb78Dir(tb), Set78); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mapped78.Store(nil) })
	return mapped78.Load()
}

func TestParseTableSet(t *testing.T) {
	for _, s := range []string{"663", "78"} {
		if got, err := ParseTableSet(s); err != nil || string(got) != s {
			t.Fatalf("%q: %q, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "7-8", "555", "78 "} {
		if _, err := ParseTableSet(s); err == nil {
			t.Fatalf("%q accepted", s)
		}
	}
}

// TestMapPDB writes a small database, maps it back and compares every
// byte; a wrong header, a wrong size and a missing file are refused.
func TestMapPDB(t *testing.T) {
	dir := t.TempDir()
	tiles := []uint8{1, 2, 3, 6, 7}
	p, err := buildPDB(t.Context(), 2, 5, tiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePDB(dir, p); err != nil {
		t.Fatal(err)
	}
	q, err := mapPDB(dir, 2, 5, tiles)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.data, q.data) {
		t.Fatal("mapped entries differ from the built ones")
	}
	if _, err := mapPDB(dir, 2, 5, []uint8{1, 2, 3, 6, 8}); err == nil {
		t.Fatal("missing file mapped")
	}
	name := filepath.Join(dir, pdbFileName(2, 5, tiles))
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{raw[:len(raw)-1], append(slices.Clone(raw), 0), func() []byte {
		b := slices.Clone(raw)
		b[9]++ // cols
		return b
	}()} {
		if err := os.WriteFile(name, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := mapPDB(dir, 2, 5, tiles); err == nil {
			t.Fatalf("damaged file (%d bytes) mapped", len(bad))
		}
	}
}

// TestVerifyFile checks the streamed checksum: an intact file passes, a
// flipped bit in the entries, a truncated file and a missing one fail.
func TestVerifyFile(t *testing.T) {
	dir := t.TempDir()
	tiles := []uint8{4, 5, 8, 9}
	p, err := buildPDB(t.Context(), 2, 5, tiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePDB(dir, p); err != nil {
		t.Fatal(err)
	}
	n, err := verifyFile(dir, 2, 5, tiles)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, pdbFileName(2, 5, tiles))
	raw, _ := os.ReadFile(name)
	if n != int64(len(raw)) {
		t.Fatalf("size %d, file %d", n, len(raw))
	}
	flip := slices.Clone(raw)
	flip[len(flip)-3] ^= 4
	for _, bad := range [][]byte{flip, raw[:len(raw)-2]} {
		if err := os.WriteFile(name, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := verifyFile(dir, 2, 5, tiles); err == nil {
			t.Fatal("damaged file verified")
		}
	}
	os.Remove(name)
	if _, err := verifyFile(dir, 2, 5, tiles); err == nil {
		t.Fatal("missing file verified")
	}
}

// TestUseTablesMissing: without the files, UseTables reports
// ErrTablesMissing and 4×4 stays on 6-6-3.
func TestUseTablesMissing(t *testing.T) {
	err := UseTables(t.TempDir(), Set78)
	if !errors.Is(err, ErrTablesMissing) {
		t.Fatalf("err = %v", err)
	}
	if ActiveTables() != Set663 || MappedBytes() != 0 {
		t.Fatalf("active %s, mapped %d", ActiveTables(), MappedBytes())
	}
	if err := UseTables("", Set663); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyTables(t.TempDir(), Set78); err == nil {
		t.Fatal("empty directory verified")
	}
}

// Test78Korf100 solves Korf's 100 instances with the mapped 7-8 tables
// through Solve: every length is the published optimum and every path
// replays to the goal.
func Test78Korf100(t *testing.T) {
	if raceEnabled {
		t.Skip("slow under -race")
	}
	use78(t)
	if ActiveTables() != Set78 || MappedBytes() != 259459200+28828800 {
		t.Fatalf("active %s, mapped %d", ActiveTables(), MappedBytes())
	}
	for _, in := range loadKorf(t) {
		checkAgainst(t, in.board, in.optimal)
	}
}

// Test78AgainstReference compares the 7-8 tables with the 6-6-3 ones (both
// admissible, so both optimal) and with the bidirectional BFS on 2,000
// random walks from the goal: equal lengths, every path replayed, and h never
// above the true distance.
func Test78AgainstReference(t *testing.T) {
	if raceEnabled {
		t.Skip("slow under -race")
	}
	h663, err := heuristicFor(t.Context(), 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	use78(t)
	rng := newRand(78)
	n := 2000
	if testing.Short() {
		n = 200
	}
	for i := range n {
		length := 10 + i%50
		if i%10 == 9 {
			length = 200 // a deep board, 40 to 60 moves from the goal
		}
		b := randomWalk(rng, 4, 4, length)
		want := -1
		if length <= 16 {
			want = boundedBFS(b, length)
		} else {
			p, z := pack(b)
			path, _, err := idaStar(context.Background(), h663, p, z, Options{MaxNodes: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			want = len(path)
		}
		checkAgainst(t, b, want)
	}
}

// FuzzPDBFile feeds arbitrary bytes to the database file readers in
// place of a 2×2-tile database of 2×5: mapPDB and verifyFile must refuse
// or accept without panicking, accept only a file whose header and size
// are right, and verifyFile only one that mapPDB accepts too. The seed corpus holds an
// intact file and damaged copies.
func FuzzPDBFile(f *testing.F) {
	tiles := []uint8{1, 6}
	p, err := buildPDB(context.Background(), 2, 5, tiles)
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	if err := writePDB(dir, p); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, pdbFileName(2, 5, tiles)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte(pdbMagic))
	f.Fuzz(func(t *testing.T, raw []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, pdbFileName(2, 5, tiles)), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		q, merr := mapPDB(dir, 2, 5, tiles)
		_, verr := verifyFile(dir, 2, 5, tiles)
		if merr == nil {
			defer unmapFile(q.mapped)
			if !bytes.HasPrefix(raw, pdbHeader(2, 5, tiles, permCount(10, 2))) || len(q.data) != len(p.data) {
				t.Fatalf("accepted a file with a wrong header or size")
			}
		}
		if verr == nil && merr != nil {
			t.Fatalf("verified a file that does not map: %v", merr)
		}
	})
}
