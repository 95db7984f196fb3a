package app

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, scan, floor uint64
		want              int
	}{
		{4 * mib, 4 * mib, 64 * mib, 1500}, // goal 4 + 4 × 15 = 64
		{1 * mib, 2 * mib, 64 * mib, 1600}, // the heap minimum, 4 × 16, is the floor
		{4 * mib, 6 * mib, 64 * mib, 1000}, // stacks and globals count
		{8 * mib, 8 * mib, 64 * mib, 700},
		{16 * mib, 16 * mib, 64 * mib, 300},
		{31 * mib, 32 * mib, 64 * mib, 103},
		{32 * mib, 32 * mib, 64 * mib, 100}, // GOGC=100 reaches the floor
		{200 * mib, 201 * mib, 64 * mib, 100},
		{1, 1, 64 * mib, 1600},
		{1, 1, 2 * mib, 100}, // a floor under the heap minimum is GOGC=100's
	} {
		if got := gcPercentFor(c.live, c.scan, c.floor); got != c.want {
			t.Errorf("gcPercentFor(%d, %d MiB, %d MiB) = %d, want %d", c.live/mib, c.scan/mib, c.floor/mib, got, c.want)
		}
	}
}

// TestGCHeapFloor runs a child process (the floor is process-wide and
// lasts its life) that sets the floor and then allocates: with a small
// live heap the GC's goal must reach the floor, and with a live heap
// past half the floor it must be GOGC=100's, so large requests keep
// their memory bounds. With GOGC set, the floor stays off.
func TestGCHeapFloor(t *testing.T) {
	if os.Getenv("PQ_GCFLOOR_CHILD") != "" {
		gcFloorChild()
		return
	}
	for _, c := range []struct {
		name, gogc, want string
	}{
		{"floor", "", "ok"},
		{"gogc set", "100", "off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestGCHeapFloor$")
			cmd.Env = append(os.Environ(), "PQ_GCFLOOR_CHILD=1", "GOGC="+c.gogc)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "child: "+c.want) {
				t.Fatalf("child: %v\n%s", err, out)
			}
			t.Logf("%s", out)
		})
	}
}

// gcFloorChild prints "child: ok" when the floor held the goal as
// TestGCHeapFloor says, "child: off" when it was not set, and what it
// saw otherwise. It first allocates without calling runtime.GC, as a
// server does: the collector must keep running (a tuner that set no goal
// before the first cycle stopped it for good), with its goal at the
// floor. The garbage comes at about 500 MB/s, a busy server's rate: much
// faster, and objects allocated during each cycle's mark, which count as
// live, inflate every goal whatever GOGC is.
func gcFloorChild() {
	const floor = 16 << 20
	if os.Getenv("GOGC") == "" {
		os.Unsetenv("GOGC")
	}
	set := SetGCHeapFloor(floor, os.Getenv, slog.New(slog.NewTextHandler(io.Discard, nil)))
	read := func(name string) uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	// 320 MiB of garbage in 64 KiB pieces, some kept a little while, with
	// the goal sampled as it goes.
	var keep [16][]byte
	var goals []uint64
	for i := range 5 << 10 {
		b := make([]byte, 64<<10)
		b[0] = byte(i)
		keep[i%len(keep)] = b
		if i%16 == 15 {
			goals = append(goals, read("/gc/heap/goal:bytes"))
			time.Sleep(2 * time.Millisecond)
		}
	}
	cycles := read("/gc/cycles/total:gc-cycles")
	gogc := read("/gc/gogc:percent")
	slices.Sort(goals)
	small := goals[len(goals)/2]
	big := make([]byte, 48<<20) // live heap past half the floor
	for i := range big {
		big[i] = byte(i)
	}
	for range 5 {
		runtime.GC()
		runtime.Gosched()
	}
	large := read("/gc/heap/goal:bytes")
	runtime.KeepAlive(big)
	runtime.KeepAlive(keep)
	switch {
	case !set && gogc == 100:
		println("child: off; median goal", small)
	case set && cycles >= 8 && small >= floor*9/10 && small <= floor*5/4 && large >= 96<<20 && large <= 110<<20:
		println("child: ok; cycles", cycles, "median goal", small, "goal with 48 MiB live", large)
	default:
		println("child: set", set, "GOGC", gogc, "cycles", cycles, "median goal with a small heap", small, "with 48 MiB live", large)
	}
}
