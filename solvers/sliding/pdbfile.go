package sliding

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// pdbMagic starts every database file. The format is
//
//	magic "PZQPDB2\n" | rows, cols, k (1 byte each) | the k pattern tiles |
//	entry count (uint32, little endian) | SHA-256 of the entries |
//	entries, four bits each (pdb.data)
//
// A file whose header does not match the wanted database, whose length is
// wrong or whose checksum fails is treated as missing.
const pdbMagic = "PZQPDB2\n"

// pdbFileName names the file of a database: "sliding-4x4-1.5.6.9.10.13.pdb".
func pdbFileName(rows, cols int, tiles []uint8) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "sliding-%dx%d-", rows, cols)
	for i, t := range tiles {
		if i > 0 {
			sb.WriteByte('.')
		}
		sb.WriteString(strconv.Itoa(int(t)))
	}
	sb.WriteString(".pdb")
	return sb.String()
}

// pdbHeader returns the header of a database file, checksum excluded.
func pdbHeader(rows, cols int, tiles []uint8, count int) []byte {
	h := []byte(pdbMagic)
	h = append(h, byte(rows), byte(cols), byte(len(tiles)))
	h = append(h, tiles...)
	return binary.LittleEndian.AppendUint32(h, uint32(count))
}

// readPDB reads the database of the pattern tiles from dir, reporting
// false when the file is missing or does not verify.
func readPDB(dir string, rows, cols int, tiles []uint8) (*pdb, bool) {
	raw, err := os.ReadFile(filepath.Join(dir, pdbFileName(rows, cols, tiles)))
	if err != nil {
		return nil, false
	}
	count := permCount(rows*cols, len(tiles))
	head := pdbHeader(rows, cols, tiles, count)
	if len(raw) != len(head)+sha256.Size+nibbleBytes(count) || !bytes.Equal(raw[:len(head)], head) {
		return nil, false
	}
	sum := raw[len(head) : len(head)+sha256.Size]
	data := raw[len(head)+sha256.Size:]
	if got := sha256.Sum256(data); !bytes.Equal(got[:], sum) {
		return nil, false
	}
	return &pdb{rows: rows, cols: cols, n: rows * cols, tiles: append([]uint8(nil), tiles...), data: data}, true
}

// writePDB writes p to its file in dir atomically: to a temporary file in
// dir first, then renamed over the final name, so a reader never sees a
// partial file.
func writePDB(dir string, p *pdb) error {
	name := filepath.Join(dir, pdbFileName(p.rows, p.cols, p.tiles))
	f, err := os.CreateTemp(dir, filepath.Base(name)+".tmp*")
	if err != nil {
		return fmt.Errorf("sliding: writing pattern database: %w", err)
	}
	sum := sha256.Sum256(p.data)
	buf := pdbHeader(p.rows, p.cols, p.tiles, permCount(p.n, len(p.tiles)))
	buf = append(buf, sum[:]...)
	_, err = f.Write(buf)
	if err == nil {
		_, err = f.Write(p.data)
	}
	if err == nil {
		err = f.Chmod(0o644) // CreateTemp makes 0600; the cache is not secret
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("sliding: writing pattern database: %w", err)
	}
	return nil
}
