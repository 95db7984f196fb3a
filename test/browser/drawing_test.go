package browser_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// The puzzles the drawing test submits, as one batch; the test reads
// their answers from the API and holds the drawings to them.
var (
	slidingBoard = [][]int{{8, 1, 3}, {4, 0, 2}, {7, 6, 5}}
	sweepBoard   = []string{"......", ".*..*.", "......", "..*...", "......"}
	fillBoard    = [][]int{{0, 0, 1, 1, 1, 1}, {1, 0, 1, 1, 0, 1}, {1, 1, 1, 1, 0, 1}, {1, 1, 1, 0, 0, 1}, {0, 1, 1, 1, 1, 1}, {0, 0, 0, 1, 1, 1}}
	fillTable    = [][]int{{1, 1, 1, 0, 0, 1}, {0, 0, 0, 0, 1, 1}, {0, 1, 0, 0, 0, 0}, {1, 1, 0, 1, 0, 0}, {0, 0, 0, 1, 1, 1}, {0, 0, 0, 0, 0, 0}}
)

// Item indexes in the drawing test's batch.
const (
	itemSliding = iota
	itemUnsolvable
	itemSweep
	itemFailed
	itemFill
	itemBigFill
)

// bigFill is an n×n fill too large for SVG: horizontal domino holes on the
// board and vertical domino pieces on the table, so every placement turns.
func bigFill(n int) (board, table [][]int) {
	board, table = make([][]int, n), make([][]int, n)
	for r := 0; r < n; r++ {
		board[r], table[r] = make([]int, n), make([]int, n)
		for c := 0; c < n; c++ {
			board[r][c] = 1
			if r%3 == 0 && c%3 < 2 && c+1 < n {
				board[r][c] = 0
			}
			if c%3 == 0 && r%3 < 2 && r+1 < n {
				table[r][c] = 1
			}
		}
	}
	return board, table
}

type slidingResult struct {
	Moves    int    `json:"moves"`
	Solvable bool   `json:"solvable"`
	Path     string `json:"path"`
}

type sweepResult struct {
	Moves int    `json:"moves"`
	Start []int  `json:"start"`
	Path  string `json:"path"`
}

type fillResult struct {
	Filled     int `json:"filled"`
	Placements []struct {
		Piece    [][2]int `json:"piece"`
		Hole     [][2]int `json:"hole"`
		Rotation int      `json:"rotation"`
		Flipped  bool     `json:"flipped"`
	} `json:"placements"`
}

// cellMark is one cell of a grid as the page drew it.
type cellMark struct {
	R, C  int
	Class string
	Roll  string // sweep: the roll that visited it ("0" for the start)
	P     string // fill: the placement that covers it
	Fill  string // fill: its colour
}

// TestItemsDrawnInBrowser opens completed, unsolvable and failed items
// of each kind at their own URLs and holds each drawing to the puzzle
// and the answer the API gives: the sliding tiles to the board, replayed
// to the goal; the sweep's obstacles, start and rolls; the fill's
// placements, in SVG and, for a large one, on a canvas.
func TestItemsDrawnInBrowser(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 1, nil)

	bigBoard, bigTable := bigFill(120)
	reqs := []map[string]any{
		itemSliding:    {"custom_id": "eight", "kind": "sliding", "puzzle": map[string]any{"board": slidingBoard}},
		itemUnsolvable: {"kind": "sliding", "puzzle": map[string]any{"board": [][]int{{1, 2, 3}, {4, 5, 6}, {8, 7, 0}}}},
		itemSweep:      {"kind": "sweep", "puzzle": map[string]any{"board": sweepBoard}},
		itemFailed:     {"kind": "sweep", "puzzle": map[string]any{"board": []string{"........", "........", "........"}}, "options": map[string]any{"max_nodes": 1}},
		itemFill:       {"kind": "fill", "puzzle": map[string]any{"game_board": fillBoard, "table": fillTable}},
		itemBigFill:    {"kind": "fill", "puzzle": map[string]any{"game_board": bigBoard, "table": bigTable}},
	}
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": reqs})
	if code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	batch := stacktest.Decode[apitype.BatchCreated](t, b).ID
	if code, b = s.Do("GET", "/v1/batches/"+batch+"?wait=30s&limit=1", nil); code != 200 || !stacktest.Decode[apitype.Batch](t, b).Done {
		t.Fatalf("the batch did not end within 30 s: %d %s", code, b)
	}
	task := func(i int) apitype.Task {
		t.Helper()
		code, b := s.Do("GET", "/v1/tasks/"+apitype.ItemID(batch, i), nil)
		if code != 200 {
			t.Fatalf("item %d: %d %s", i, code, b)
		}
		return stacktest.Decode[apitype.Task](t, b)
	}
	// open shows an item by its URL and waits for its drawing.
	open := func(i int, state string) {
		t.Helper()
		id := apitype.ItemID(batch, i)
		p.do("open item "+id, chromedp.Navigate(s.URL+"/ui/#/items/"+id))
		p.waitFor("item "+id+" drawn", `document.getElementById("item").dataset.id === `+js(id)+
			` && document.getElementById("item").dataset.ready === `+js(state), 10*time.Second)
	}

	t.Run("sliding", func(t *testing.T) {
		tk := task(itemSliding)
		var res slidingResult
		if err := json.Unmarshal(tk.Result, &res); err != nil || !res.Solvable || res.Moves < 4 || len(res.Path) != res.Moves {
			t.Fatalf("sliding result %s (%v): want a solvable board of several moves", tk.Result, err)
		}
		open(itemSliding, "completed")
		// The tiles stand where the board has them, by where the browser
		// laid them out (not only by their attributes).
		tilesAt := `(() => { const s = document.querySelector("#drawing svg.sliding"), b = s.getBoundingClientRect();
			const cell = b.width / 3; const out = [[0,0,0],[0,0,0],[0,0,0]];
			for (const g of s.querySelectorAll(".tile")) { const r = g.getBoundingClientRect();
				out[Math.floor((r.top + r.height / 2 - b.top) / cell)][Math.floor((r.left + r.width / 2 - b.left) / cell)] = Number(g.dataset.value); }
			return out; })()`
		if got := eval[[][]int](p, tilesAt); fmt.Sprint(got) != fmt.Sprint(slidingBoard) {
			t.Errorf("tiles drawn at %v, want the board %v", got, slidingBoard)
		}
		if got := eval[string](p, `document.getElementById("move-count").textContent`); got != fmt.Sprint(res.Moves) {
			t.Errorf("move count %q, want %d", got, res.Moves)
		}
		if !eval[bool](p, `document.getElementById("replay-goal").hidden`) {
			t.Error("the goal is shown before any move")
		}
		p.shot("7-sliding-start")

		// Play runs by itself at the fastest speed; pause stops it.
		p.do("play", chromedp.SetValue(chromedp.ID("replay-speed"), "8"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("replay-speed").dispatchEvent(new Event("change"))`),
			chromedp.Click(chromedp.ID("replay-play")))
		p.waitFor("the replay to advance", `Number(document.getElementById("drawing").dataset.step) >= 2`, 5*time.Second)
		p.do("pause", chromedp.Click(chromedp.ID("replay-play")))
		paused := eval[int](p, `Number(document.getElementById("drawing").dataset.step)`)
		p.do("wait while paused", chromedp.Sleep(400*time.Millisecond))
		if now := eval[int](p, `Number(document.getElementById("drawing").dataset.step)`); now != paused {
			t.Errorf("the replay moved from step %d to %d while paused", paused, now)
		}
		// Back to the start, then step to the end one move at a time.
		p.do("back to the start", chromedp.Click(chromedp.ID("replay-start")))
		for i := 1; i <= res.Moves; i++ {
			p.do(fmt.Sprintf("step %d", i), chromedp.Click(chromedp.ID("replay-step")))
			want := fmt.Sprintf("move %d of %d (%c)", i, res.Moves, res.Path[i-1])
			if got := eval[string](p, `document.getElementById("replay-pos").textContent`); got != want {
				t.Fatalf("after step %d the replay says %q, want %q", i, got, want)
			}
		}
		goal := [][]int{{1, 2, 3}, {4, 5, 6}, {7, 8, 0}}
		// Tiles slide into place (a short transition): wait for the layout.
		p.waitFor("the tiles at the goal", tilesAt+`.flat().join() === "1,2,3,4,5,6,7,8,0"`, 5*time.Second)
		if got := eval[[][]int](p, tilesAt); fmt.Sprint(got) != fmt.Sprint(goal) {
			t.Errorf("tiles at the end %v, want %v", got, goal)
		}
		if eval[bool](p, `document.getElementById("replay-goal").hidden`) || !eval[bool](p, `document.getElementById("replay-step").disabled`) {
			t.Error("at the last move the goal is not shown, or a step forward is still offered")
		}
		p.shot("8-sliding-goal")
		p.elementShot("#item", "item-sliding")
		p.do("one move back", chromedp.Click(chromedp.ID("replay-back")))
		if !eval[bool](p, `document.getElementById("replay-goal").hidden`) {
			t.Error("the goal is still shown a move before it")
		}

		open(itemUnsolvable, "completed")
		if got := eval[string](p, `document.querySelector("#drawing .banner").textContent`); !strings.HasPrefix(got, "unsolvable") {
			t.Errorf("the unsolvable board's drawing says %q", got)
		}
		if eval[bool](p, `!!document.getElementById("replay-step")`) {
			t.Error("an unsolvable board offers a replay")
		}
	})

	t.Run("sweep", func(t *testing.T) {
		var res sweepResult
		if err := json.Unmarshal(task(itemSweep).Result, &res); err != nil || res.Moves < 3 || len(res.Start) != 2 {
			t.Fatalf("sweep result %+v (%v): want a game of several rolls", res, err)
		}
		open(itemSweep, "completed")
		cells := eval[[]cellMark](p, `[...document.querySelectorAll("#drawing svg.sweep rect.cell")].map(e =>
			({R: +e.dataset.r, C: +e.dataset.c, Class: e.getAttribute("class"), Roll: e.dataset.roll || ""}))`)
		// The rolls replayed here, independently of the page: each goes
		// until an obstacle, the border or a visited cell.
		roll := map[[2]int]int{{res.Start[0], res.Start[1]}: 0}
		r, c := res.Start[0], res.Start[1]
		var ends [][2]int
		for i, d := range res.Path {
			dr, dc := rollDirs[d][0], rollDirs[d][1]
			for {
				nr, nc := r+dr, c+dc
				if nr < 0 || nr >= len(sweepBoard) || nc < 0 || nc >= len(sweepBoard[0]) || sweepBoard[nr][nc] == '*' {
					break
				}
				if _, seen := roll[[2]int{nr, nc}]; seen {
					break
				}
				r, c = nr, nc
				roll[[2]int{r, c}] = i + 1
			}
			ends = append(ends, [2]int{r, c})
		}
		if len(cells) != len(sweepBoard)*len(sweepBoard[0]) {
			t.Fatalf("%d cells drawn, want %d", len(cells), len(sweepBoard)*len(sweepBoard[0]))
		}
		for _, m := range cells {
			wall := sweepBoard[m.R][m.C] == '*'
			if wall != strings.Contains(m.Class, "obstacle") {
				t.Errorf("cell %d,%d drawn %q; the board has %q", m.R, m.C, m.Class, sweepBoard[m.R][m.C])
			}
			want := ""
			if n, ok := roll[[2]int{m.R, m.C}]; ok {
				want = fmt.Sprint(n)
			}
			if !wall && want == "" {
				t.Errorf("empty cell %d,%d is not visited by the answer's rolls", m.R, m.C)
			}
			if m.Roll != want {
				t.Errorf("cell %d,%d drawn as visited by roll %q, want %q", m.R, m.C, m.Roll, want)
			}
		}
		if got := eval[[]int](p, `(() => { const g = document.querySelector("#drawing svg.sweep .start"); return [+g.dataset.r, +g.dataset.c]; })()`); fmt.Sprint(got) != fmt.Sprint(res.Start) {
			t.Errorf("start drawn at %v, want %v", got, res.Start)
		}
		type label struct{ N, R, C int }
		labels := eval[[]label](p, `[...document.querySelectorAll("#drawing svg.sweep .roll")].map(g =>
			({N: +g.dataset.n, R: +g.dataset.r, C: +g.dataset.c}))`)
		if len(labels) != res.Moves {
			t.Fatalf("%d rolls numbered, want %d", len(labels), res.Moves)
		}
		for i, l := range labels {
			if l.N != i+1 || [2]int{l.R, l.C} != ends[i] {
				t.Errorf("roll label %d = %+v, want number %d at %v", i, l, i+1, ends[i])
			}
		}
		var nums []string
		for i := 1; i <= res.Moves; i++ {
			nums = append(nums, fmt.Sprint(i))
		}
		if got := eval[string](p, `[...document.querySelectorAll("#drawing svg.sweep .roll text")].map(t => t.textContent).join()`); got != strings.Join(nums, ",") {
			t.Errorf("roll numbers drawn %q, want %q", got, strings.Join(nums, ","))
		}
		p.shot("9-sweep")
		p.elementShot("#item", "item-sweep")

		// A failed item says so on its drawing; this one is opened by ID
		// from the page's search box.
		id := apitype.ItemID(batch, itemFailed)
		p.do("open by ID", chromedp.SetValue(chromedp.ID("search"), id), chromedp.Click(chromedp.ID("search-btn")))
		p.waitFor("the failed item", `document.getElementById("item").dataset.id === `+js(id)+
			` && document.getElementById("item").dataset.ready === "failed"`, 10*time.Second)
		if h := eval[string](p, `location.hash`); h != "#/items/"+id {
			t.Errorf("opening by ID led to %s, want #/items/%s", h, id)
		}
		if got := eval[string](p, `document.querySelector("#drawing .banner").textContent`); !strings.HasPrefix(got, "failed: budget_exceeded: ") {
			t.Errorf("the failed item's drawing says %q", got)
		}
		if n := eval[int](p, `document.querySelectorAll("#drawing svg.sweep rect.cell").length`); n != 24 {
			t.Errorf("the failed item's board has %d cells drawn, want 24", n)
		}
		p.shot("10-sweep-failed")
	})

	// A single task's puzzle is not kept: its page shows the answer and
	// says why there is no drawing.
	t.Run("single task", func(t *testing.T) {
		tk := s.Submit(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`, 202)
		s.WaitTask(tk.ID, 10*time.Second)
		p.do("open the single task", chromedp.Navigate(s.URL+"/ui/#/items/"+tk.ID))
		p.waitFor("the single task", `document.getElementById("item").dataset.id === `+js(tk.ID)+
			` && document.getElementById("item").dataset.ready === "completed"`, 10*time.Second)
		if msg := eval[string](p, `document.getElementById("item-msg").textContent`); !strings.Contains(msg, "not kept") {
			t.Errorf("the single task's page says %q, want why it has no drawing", msg)
		}
		if got := eval[string](p, `document.getElementById("item-json").textContent`); got != `{"moves":1,"solvable":true,"path":"R"}` {
			t.Errorf("the single task's result shown as %s", got)
		}
		// An ID that names nothing, malformed escape included, says so.
		p.do("open a bad ID", chromedp.Navigate(s.URL+"/ui/#/items/%E0%A4%A-7"))
		p.waitFor("the bad ID's answer", `document.getElementById("item").dataset.ready === "error"`, 10*time.Second)
		if msg := eval[string](p, `document.getElementById("item-msg").textContent`); !strings.HasPrefix(msg, "no such item") {
			t.Errorf("a bad ID's page says %q", msg)
		}
	})

	t.Run("fill", func(t *testing.T) {
		var res fillResult
		if err := json.Unmarshal(task(itemFill).Result, &res); err != nil || len(res.Placements) < 2 {
			t.Fatalf("fill result %+v (%v): want two placements or more", res, err)
		}
		open(itemFill, "completed")
		if mode := eval[string](p, `document.getElementById("drawing").dataset.mode`); mode != "svg" {
			t.Errorf("a 6×6 fill drawn as %q, want svg", mode)
		}
		for _, g := range []struct {
			id   string
			grid [][]int
			at   func(int) [][2]int
		}{
			{"fill-board", fillBoard, func(i int) [][2]int { return res.Placements[i].Hole }},
			{"fill-table", fillTable, func(i int) [][2]int { return res.Placements[i].Piece }},
		} {
			cells := eval[[]cellMark](p, `[...document.querySelectorAll("#`+g.id+` rect.cell")].map(e =>
				({R: +e.dataset.r, C: +e.dataset.c, Class: e.getAttribute("class"), P: e.dataset.p ?? "", Fill: e.getAttribute("fill")}))`)
			want := map[[2]int]string{}
			for i := range res.Placements {
				for _, rc := range g.at(i) {
					want[rc] = fmt.Sprint(i)
				}
			}
			colourOf := map[string]string{}
			for _, m := range cells {
				if m.Class != fmt.Sprintf("cell v%d", g.grid[m.R][m.C]) {
					t.Errorf("%s %d,%d drawn %q, the grid has %d", g.id, m.R, m.C, m.Class, g.grid[m.R][m.C])
				}
				if m.P != want[[2]int{m.R, m.C}] {
					t.Errorf("%s %d,%d drawn as placement %q, want %q", g.id, m.R, m.C, m.P, want[[2]int{m.R, m.C}])
				}
				if m.P != "" {
					if c, ok := colourOf[m.P]; ok && c != m.Fill {
						t.Errorf("%s: placement %s drawn in %s and %s", g.id, m.P, c, m.Fill)
					}
					colourOf[m.P] = m.Fill
				}
			}
			if len(cells) != 36 || len(colourOf) != len(res.Placements) {
				t.Errorf("%s: %d cells, %d placements coloured; want 36 and %d", g.id, len(cells), len(colourOf), len(res.Placements))
			}
		}
		// Each piece has its hole's colour, and the legend its rotation.
		same := eval[bool](p, `[...document.querySelectorAll("#fill-board rect[data-p]")].every(e =>
			document.querySelector('#fill-table rect[data-p="' + e.dataset.p + '"]').getAttribute("fill") === e.getAttribute("fill"))`)
		if !same {
			t.Error("a piece and its hole are drawn in different colours")
		}
		rot := eval[[]string](p, `[...document.querySelectorAll("#drawing table.legend .rotation")].map(e => e.textContent)`)
		if len(rot) != len(res.Placements) {
			t.Fatalf("legend has %d rows, want %d", len(rot), len(res.Placements))
		}
		for i, pl := range res.Placements {
			if rot[i] != fmt.Sprintf("%d°", pl.Rotation) {
				t.Errorf("legend row %d says %q, want %d°", i, rot[i], pl.Rotation)
			}
		}
		p.shot("11-fill")
		p.elementShot("#item", "item-fill")

		// A grid too large for SVG is drawn on canvases, one pixel per
		// cell: each placed cell in its placement's colour, the rest as
		// wall, hole, unused piece or blank.
		var big fillResult
		if err := json.Unmarshal(task(itemBigFill).Result, &big); err != nil || len(big.Placements) < 100 {
			t.Fatalf("big fill: %d placements (%v)", len(big.Placements), err)
		}
		open(itemBigFill, "completed")
		if mode := eval[string](p, `document.getElementById("drawing").dataset.mode`); mode != "canvas" {
			t.Fatalf("a 120×120 fill drawn as %q, want canvas", mode)
		}
		for _, g := range []struct {
			id          string
			grid        [][]int
			at          func(int) [][2]int
			full, empty string
		}{
			{"fill-board", bigBoard, func(i int) [][2]int { return big.Placements[i].Hole }, "199,204,211", "255,255,255"},
			{"fill-table", bigTable, func(i int) [][2]int { return big.Placements[i].Piece }, "232,235,239", "255,255,255"},
		} {
			px := eval[[]string](p, `(() => { const c = document.getElementById("`+g.id+`"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
				const out = []; for (let i = 0; i < d.length; i += 4) out.push(d[i] + "," + d[i + 1] + "," + d[i + 2]); return out; })()`)
			n := len(g.grid)
			if len(px) != n*n {
				t.Fatalf("%s: %d pixels, want %d", g.id, len(px), n*n)
			}
			placed := map[int]int{}
			for i := range big.Placements {
				for _, rc := range g.at(i) {
					placed[rc[0]*n+rc[1]] = i
				}
			}
			colourOf := map[int]string{}
			for k, got := range px {
				i, ok := placed[k]
				switch {
				case ok:
					if c, seen := colourOf[i]; seen && c != got {
						t.Fatalf("%s: placement %d drawn in %s and %s", g.id, i, c, got)
					}
					colourOf[i] = got
					if got == g.full || got == g.empty {
						t.Fatalf("%s: cell %d of placement %d is not coloured (%s)", g.id, k, i, got)
					}
				case g.grid[k/n][k%n] == 1 && got != g.full, g.grid[k/n][k%n] == 0 && got != g.empty:
					t.Fatalf("%s: unplaced cell %d,%d (value %d) drawn %s", g.id, k/n, k%n, g.grid[k/n][k%n], got)
				}
			}
		}
		p.shot("12-fill-canvas")

		// The largest fill, 1000×1000, on its own batch: drawn on
		// canvases at one pixel per cell. How long the page took is
		// logged, not asserted (timings vary with the machine).
		board, table := bigFill(1000)
		code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": []map[string]any{
			{"kind": "fill", "puzzle": map[string]any{"game_board": board, "table": table}}}})
		if code != 202 {
			t.Fatalf("submit the 1000×1000 fill: %d %s", code, b)
		}
		huge := stacktest.Decode[apitype.BatchCreated](t, b).ID
		if code, b = s.Do("GET", "/v1/batches/"+huge+"?wait=60s&limit=1", nil); code != 200 || !stacktest.Decode[apitype.Batch](t, b).Done {
			t.Fatalf("the 1000×1000 fill did not end within 60 s: %d %s", code, b)
		}
		id := apitype.ItemID(huge, 0)
		// Its result is 7 MB: a read that finds the server's memory for
		// answers taken is told 503 with Retry-After, and tries again.
		var first fillResult
		for try := 0; ; try++ {
			code, b = s.Do("GET", "/v1/tasks/"+id, nil)
			if code == 503 && try < 20 {
				t.Logf("GET the 1000×1000 fill: %d %s; again", code, b)
				time.Sleep(500 * time.Millisecond)
				continue
			}
			if code != 200 {
				t.Fatalf("GET the 1000×1000 fill: %d %s", code, b)
			}
			break
		}
		if err := json.Unmarshal(stacktest.Decode[apitype.Task](t, b).Result, &first); err != nil || len(first.Placements) == 0 {
			t.Fatalf("the 1000×1000 fill's result: %v", err)
		}
		start := time.Now()
		p.do("open the 1000×1000 fill", chromedp.Navigate(s.URL+"/ui/#/items/"+id))
		p.waitFor("the 1000×1000 fill drawn", `document.getElementById("item").dataset.ready === "completed"`, 60*time.Second)
		opened := time.Since(start)
		type drawn struct {
			Mode          string
			W, H, Ms      int
			Hole, Piece   string // the first placement's first cells' colours
			Wall, Caption string
		}
		pl := first.Placements[0]
		d := eval[drawn](p, fmt.Sprintf(`(() => { const px = (id, r, c) => [...document.getElementById(id).getContext("2d").getImageData(c, r, 1, 1).data.slice(0, 3)].join();
			const b = document.getElementById("fill-board"), box = document.getElementById("drawing");
			return {Mode: box.dataset.mode, W: b.width, H: b.height, Ms: +box.dataset.ms, Hole: px("fill-board", %d, %d),
				Piece: px("fill-table", %d, %d), Wall: px("fill-board", 1, 1), Caption: box.querySelector(".draw-caption").textContent}; })()`,
			pl.Hole[0][0], pl.Hole[0][1], pl.Piece[0][0], pl.Piece[0][1]))
		if d.Mode != "canvas" || d.W != 1000 || d.H != 1000 || d.Hole != d.Piece || d.Hole == "255,255,255" || d.Wall != "199,204,211" {
			t.Errorf("the 1000×1000 fill drawn as %+v; want 1000×1000 canvases, its first piece and hole in one colour", d)
		}
		if want := fmt.Sprintf("%d cells filled by %d pieces", first.Filled, len(first.Placements)); !strings.HasPrefix(d.Caption, want) {
			t.Errorf("caption %q, want it to start %q", d.Caption, want)
		}
		t.Logf("1000×1000 fill (%d placements): drawn in %d ms, opened (read and drawn) in %s", len(first.Placements), d.Ms, opened.Round(time.Millisecond))
		p.shot("13-fill-1000")
	})
}

// rollDirs are the sweep path's directions as (row, column) steps.
var rollDirs = map[rune][2]int{'U': {-1, 0}, 'D': {1, 0}, 'L': {0, -1}, 'R': {0, 1}}

// elementShot saves a screenshot of the element sel as name.png.
func (p *page) elementShot(sel, name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(p.shots, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		p.t.Errorf("save screenshot: %v", err)
		return
	}
	p.t.Logf("screenshot %s (%d bytes)", path, len(buf))
}
