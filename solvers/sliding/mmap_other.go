//go:build !unix

package sliding

import (
	"fmt"
	"os"
)

// mapFile reads the file whole where there is no mmap. The file must be
// exactly size bytes long.
func mapFile(name string, size int) ([]byte, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	if len(b) != size {
		return nil, fmt.Errorf("%s: %d bytes, want %d", name, len(b), size)
	}
	return b, nil
}

// unmapFile releases a buffer of mapFile (the garbage collector does).
func unmapFile([]byte) {}
