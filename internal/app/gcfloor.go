package app

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// SetGCHeapFloor keeps the Go heap's GC goal at no less than floor bytes:
// after each collection it sets GOGC so that the next one starts at
// max(2 × live heap, floor), the goal GOGC=100 gives once the live heap
// is past about floor/2. It returns whether it did; it does nothing when floor
// is 0 or GOGC is set, which the runtime has then applied itself.
//
// Why: the API's live heap is a few MiB, so at GOGC=100 a burst of small
// requests collects every 4–8 MiB of garbage, several times a second. On
// cache hits a floor of 32 MiB cuts the API's CPU per hit by
// 6–11%, for 58 MiB of peak RSS instead of 34 (docs/capacity.md). It
// costs nothing where the live heap is large (an upload, the worker's
// pattern databases): there the goal is GOGC=100's, so the documented
// memory bounds hold as before. The soft memory limit (SetMemoryLimit)
// still wins over the floor.
//
// The goal is set once per cycle from the finalizer of an object that
// each cycle frees, the only hook the runtime offers after a collection.
// A process sets it once; later calls do nothing.
func SetGCHeapFloor(floor int64, getenv func(string) string, log *slog.Logger) bool {
	if floor <= 0 {
		return false
	}
	if v := getenv("GOGC"); v != "" {
		log.Info("gc heap floor off", "gogc", v, "source", "GOGC")
		return false
	}
	set := false
	gcFloorOnce.Do(func() {
		set = true
		t := &gcTuner{floor: uint64(floor), sample: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
		t.tune()
		t.arm()
		log.Info("gc heap floor", "floor_bytes", floor)
	})
	return set
}

var gcFloorOnce sync.Once

// gcTuner holds the floor between collections.
type gcTuner struct {
	floor  uint64
	sample []metrics.Sample
	last   int
}

// gcSentinel is freed by each collection; its finalizer re-arms it. It is
// larger than 16 bytes and holds a pointer, so it is not in a tiny block
// that something else could keep alive.
type gcSentinel struct {
	t   *gcTuner
	pad [2]uint64
}

func (t *gcTuner) arm() {
	runtime.SetFinalizer(&gcSentinel{t: t}, func(s *gcSentinel) {
		s.t.tune()
		s.t.arm()
	})
}

// tune sets GOGC for the next cycle from the live heap the last one
// left.
func (t *gcTuner) tune() {
	metrics.Read(t.sample)
	var v [3]uint64
	for i, s := range t.sample {
		if s.Value.Kind() != metrics.KindUint64 {
			return // a runtime without the metric: GOGC as it is
		}
		v[i] = s.Value.Uint64()
	}
	if v[0] == 0 {
		// No cycle has marked the heap yet: a goal computed from
		// nothing would be no goal, and with no cycle the finalizer
		// that tunes it would never run again.
		return
	}
	pct := gcPercentFor(v[0], v[0]+v[1]+v[2], t.floor)
	if pct != t.last {
		debug.SetGCPercent(pct)
		t.last = pct
	}
}

// gcPercentFor is the GOGC whose goal is the floor, and at least 100.
// The runtime's goal is the larger of live + scan × GOGC/100, where scan
// is the live heap plus the goroutine stacks and globals it scans, and
// its heap minimum, 4 MiB × GOGC/100: so GOGC stops at 100 × floor / 4
// MiB, or a live heap of 1 MiB would get a goal of several floors.
func gcPercentFor(live, scan, floor uint64) int {
	if live+scan >= floor {
		return 100
	}
	return int(max(min((floor-live)*100/scan, floor*100/runtimeHeapMinimum), 100))
}

// runtimeHeapMinimum is the Go runtime's heap minimum at GOGC=100
// (defaultHeapMinimum in runtime/mgcpacer.go), which it scales by GOGC.
const runtimeHeapMinimum = 4 << 20
