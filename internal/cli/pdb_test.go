package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPDBVerifyMissing: verify of a directory without the files names each
// missing file and exits 1; a bad --set is a usage error.
func TestPDBVerifyMissing(t *testing.T) {
	dir := t.TempDir()
	code, out, _ := run(t, "", "pdb", "verify", dir)
	if code != 1 || !strings.Contains(out, "sliding-4x4-1.2.3.4.5.6.7.8.pdb") ||
		!strings.Contains(out, "sliding-4x4-9.10.11.12.13.14.15.pdb") {
		t.Fatalf("exit %d, out %q", code, out)
	}
	for _, args := range [][]string{
		{"pdb", "verify", dir, "--set", "555"},
		{"pdb", "build", dir, "--set", "7-8"},
		{"pdb", "verify"},
		{"pdb", "build", dir, dir},
	} {
		if code, _, errOut := run(t, "", args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// TestLocalSolveUsesPDBDir: with $PDB_DIR set, solve --local keeps the
// tables there rather than in the user cache directory, and with
// PDB_SET=78 and no 7-8 files it says it falls back to 6-6-3 and still
// solves.
func TestLocalSolveUsesPDBDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PDB_DIR", dir)
	t.Setenv("PDB_SET", "78")
	req := `{"kind":"sliding","puzzle":{"board":[[1,2,3,4,5],[6,7,8,0,9]]}}` + "\n"
	code, out, errOut := run(t, req, "solve", "--local", "--format", "json")
	if code != 0 || !strings.Contains(out, `"moves":1`) || !strings.Contains(errOut, "using 6-6-3") {
		t.Fatalf("exit %d, out %q, stderr %q", code, out, errOut)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "sliding-2x5-*")); len(files) != 2 {
		t.Fatalf("files in PDB_DIR: %v, want the two of 2x5", files)
	}
}

// TestPDBBuildVerify663 builds the small set into a fresh directory, then
// verifies it; a second build keeps every file, and a damaged file fails
// verify with exit 1.
func TestPDBBuildVerify663(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("builds the 6-6-3 tables: seconds of CPU, far more under -race")
	}
	dir := filepath.Join(t.TempDir(), "pdb")
	code, out, errOut := run(t, "", "pdb", "build", dir, "--set", "663")
	if code != 0 || strings.Count(out, "built") != 3 {
		t.Fatalf("build: exit %d, out %q, stderr %q", code, out, errOut)
	}
	if others, _ := filepath.Glob(filepath.Join(dir, "sliding-3x5-*")); len(others) != 3 {
		t.Fatalf("3x5 tables: %v", others)
	}
	code, out, _ = run(t, "", "pdb", "build", dir, "--set", "663")
	if code != 0 || strings.Count(out, "kept") != 3 {
		t.Fatalf("rebuild: exit %d, out %q", code, out)
	}
	if code, out, _ = run(t, "", "pdb", "verify", dir, "--set", "663"); code != 0 || strings.Count(out, " ok") != 3 {
		t.Fatalf("verify: exit %d, out %q", code, out)
	}
	name := filepath.Join(dir, "sliding-4x4-2.3.4.pdb")
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1
	if err := os.WriteFile(name, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, _ = run(t, "", "pdb", "verify", dir, "--set", "663"); code != 1 || !strings.Contains(out, "checksum") {
		t.Fatalf("verify after damage: exit %d, out %q", code, out)
	}
}
