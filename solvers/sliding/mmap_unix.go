//go:build unix

package sliding

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps the file read-only and shared, so that every process
// mapping it reads the same page-cache pages. The file must be exactly
// size bytes long.
func mapFile(name string, size int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("%s: %d bytes, want %d", name, st.Size(), size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", name, err)
	}
	return b, nil
}

// unmapFile releases a mapping of mapFile.
func unmapFile(b []byte) { _ = syscall.Munmap(b) }
