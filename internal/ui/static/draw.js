// puzzleq dashboard: puzzles drawn. Draw.render(box, task, req) draws a
// task (GET /v1/tasks/{id}) on the puzzle it was asked to solve (req, GET
// /v1/tasks/{id}/puzzle: {kind, puzzle, options}) into box:
//   - sliding: the board as tiles and the solution replayed move by move;
//   - sweep: the grid, the start cell and the rolls, numbered;
//   - fill: the game board and the table, each placement in its colour.
// A task that did not complete, or has no answer, says so on the drawing.
// Everything is SVG except a fill too large for it, drawn on a canvas one
// pixel per cell. Text goes in with textContent only.
"use strict";

const Draw = (() => {
  const NS = "http://www.w3.org/2000/svg";
  // A fill of more cells than this per grid is drawn on a canvas: an SVG
  // element per cell stops being responsive in the tens of thousands.
  const SVG_MAX_CELLS = 4096;
  const LEGEND_MAX = 200; // placements listed under a fill

  let current = null; // the drawing shown now: {stop()}

  function svg(tag, attrs = {}, ...kids) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    for (const k of kids) e.append(k);
    return e;
  }

  function h(tag, attrs = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, String(v));
    }
    for (const k of kids) e.append(k);
    return e;
  }

  function svgText(x, y, s, attrs = {}) {
    const t = svg("text", Object.assign({ x, y, "text-anchor": "middle", "dominant-baseline": "central" }, attrs));
    t.textContent = s;
    return t;
  }

  // cellSize fits a grid of rows×cols into about px pixels, within [lo, hi].
  function cellSize(rows, cols, px, lo, hi) {
    return Math.max(lo, Math.min(hi, Math.floor(px / Math.max(rows, cols))));
  }

  // stage wraps a drawing so that a banner can be laid over it.
  function stage(...kids) {
    return h("div", { class: "stage" }, ...kids);
  }

  // banner says on the drawing why there is no answer to show.
  function banner(st, text, cls) {
    st.append(h("div", { class: "banner " + (cls || ""), text }));
  }

  // outcome is what the drawing must say of a task that has no answer to
  // draw, or "" when it completed.
  function outcome(task) {
    switch (task.state) {
      case "completed": return "";
      case "failed": return "failed: " + (task.error ? task.error.code + ": " + task.error.message : "no reason given");
      case "canceled": return "canceled" + (task.error && task.error.message ? ": " + task.error.message : "");
      default: return "not solved yet: " + task.state;
    }
  }

  function render(box, task, req) {
    stop();
    box.replaceChildren();
    box.removeAttribute("data-kind");
    box.removeAttribute("data-mode");
    box.removeAttribute("data-outcome");
    box.removeAttribute("data-ms");
    if (!req || !req.puzzle) {
      box.append(h("p", { class: "muted", text: "no drawing: the puzzle is not available" }));
      return;
    }
    const t0 = performance.now();
    box.dataset.kind = req.kind;
    const why = outcome(task);
    box.dataset.outcome = why ? task.state : "completed";
    const res = why ? null : task.result;
    if (req.kind === "sliding") sliding(box, req.puzzle, res, why);
    else if (req.kind === "sweep") sweep(box, req.puzzle, res, why);
    else if (req.kind === "fill") fill(box, req.puzzle, res, why, req.options || {});
    else box.append(h("p", { class: "muted", text: "no drawing for kind " + req.kind }));
    box.dataset.ms = String(Math.round(performance.now() - t0)); // what drawing took, for tests
  }

  function stop() {
    if (current) current.stop();
    current = null;
  }

  // ---- sliding ----

  const DIRS = { U: [-1, 0], D: [1, 0], L: [0, -1], R: [0, 1] };
  const INVERSE = { U: "D", D: "U", L: "R", R: "L" };

  function sliding(box, pz, res, why) {
    const grid = pz.board.map((row) => row.slice());
    const R = grid.length, C = grid[0].length;
    const cell = cellSize(R, C, 320, 40, 80);
    const W = C * cell, H = R * cell;
    const s = svg("svg", { class: "board sliding", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    s.append(svg("rect", { class: "frame", x: 0, y: 0, width: W, height: H, rx: 6 }));
    let blank = null;
    const tiles = new Map();
    for (let r = 0; r < R; r++) {
      for (let c = 0; c < C; c++) {
        const v = grid[r][c];
        if (v === 0) { blank = [r, c]; continue; }
        const g = svg("g", { class: "tile", "data-value": v },
          svg("rect", { x: 3, y: 3, width: cell - 6, height: cell - 6, rx: 6 }),
          svgText(cell / 2, cell / 2, String(v), { "font-size": Math.round(cell * 0.4) }));
        tiles.set(v, g);
        s.append(g);
      }
    }
    const place = () => {
      for (let r = 0; r < R; r++) {
        for (let c = 0; c < C; c++) {
          const g = tiles.get(grid[r][c]);
          if (!g) continue;
          g.setAttribute("transform", `translate(${c * cell},${r * cell})`);
          g.dataset.r = r;
          g.dataset.c = c;
          g.classList.toggle("home", grid[r][c] === r * C + c + 1);
        }
      }
    };
    const atGoal = () => grid.every((row, r) => row.every((v, c) => v === (r * C + c + 1) % (R * C)));
    // move slides the blank one cell in direction d (a tile the other way).
    const move = (d) => {
      const [dr, dc] = DIRS[d];
      const [br, bc] = blank, nr = br + dr, nc = bc + dc;
      if (nr < 0 || nr >= R || nc < 0 || nc >= C) return false;
      grid[br][bc] = grid[nr][nc];
      grid[nr][nc] = 0;
      blank = [nr, nc];
      return true;
    };
    place();
    const st = stage(s);
    const head = h("p", { class: "draw-caption" });
    box.append(head, st);
    if (why) {
      head.textContent = R + "×" + C + " board";
      banner(st, why, "failed");
      return;
    }
    if (!res || !res.solvable || res.moves < 0) {
      head.textContent = R + "×" + C + " board · no solution";
      banner(st, "unsolvable: the goal cannot be reached from this board", "unsolvable");
      box.dataset.outcome = "unsolvable";
      return;
    }
    const path = String(res.path || "");
    head.append(h("strong", { id: "move-count", text: String(res.moves) }),
      " move" + (res.moves === 1 ? "" : "s") + " · " + R + "×" + C + " board · path " + (path || "(already solved)"));
    let at = 0;
    let timer = null;
    const pos = h("span", { id: "replay-pos", class: "mono" });
    const goal = h("span", { id: "replay-goal", class: "goal", text: "goal reached" });
    const btn = (id, label, title) => h("button", { id, type: "button", title, text: label });
    // Labels are words and the two triangles every font has.
    const bStart = btn("replay-start", "start", "back to the start");
    const bBack = btn("replay-back", "◀ back", "one move back");
    const bPlay = btn("replay-play", "play", "play the moves");
    const bStep = btn("replay-step", "step ▶", "one move forward");
    const bEnd = btn("replay-end", "end", "to the last move");
    const speed = h("select", { id: "replay-speed", title: "moves per second" });
    for (const v of ["0.5", "1", "2", "4", "8"]) {
      const o = h("option", { value: v, text: v + "×" });
      if (v === "2") o.selected = true;
      speed.append(o);
    }
    const show = () => {
      place();
      const done = atGoal();
      pos.textContent = "move " + at + " of " + path.length + (at > 0 ? " (" + path[at - 1] + ")" : "");
      goal.hidden = !done;
      s.classList.toggle("solved", done);
      box.dataset.step = at;
      box.dataset.goal = String(done);
      bBack.disabled = bStart.disabled = at === 0;
      bStep.disabled = bEnd.disabled = at >= path.length;
      bPlay.textContent = timer ? "pause" : "play";
      bPlay.disabled = !timer && at >= path.length;
    };
    const forward = () => {
      if (at >= path.length) return false;
      if (!move(path[at])) { pause(); pos.textContent = "move " + (at + 1) + " leaves the board"; return false; }
      at++;
      return true;
    };
    const back = () => {
      if (at === 0) return false;
      at--;
      move(INVERSE[path[at]]);
      return true;
    };
    const pause = () => { if (timer) clearInterval(timer); timer = null; };
    const play = () => {
      pause();
      if (at >= path.length) return;
      timer = setInterval(() => { if (!forward() || at >= path.length) pause(); show(); }, 500 / Number(speed.value));
      show();
    };
    bStart.addEventListener("click", () => { pause(); while (back()); show(); });
    bBack.addEventListener("click", () => { pause(); back(); show(); });
    bStep.addEventListener("click", () => { pause(); forward(); show(); });
    bEnd.addEventListener("click", () => { pause(); while (forward()); show(); });
    bPlay.addEventListener("click", () => { if (timer) { pause(); show(); } else play(); });
    speed.addEventListener("change", () => { if (timer) play(); });
    box.append(h("div", { class: "replay" }, bStart, bBack, bPlay, bStep, bEnd,
      h("label", {}, "speed ", speed), pos, goal));
    current = { stop: pause };
    show();
  }

  // ---- sweep ----

  function sweep(box, pz, res, why) {
    const rows = pz.board, R = rows.length, C = rows[0].length;
    const cell = cellSize(R, C, 420, 14, 48);
    const W = C * cell, H = R * cell;
    const s = svg("svg", { class: "board sweep", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    const rects = [];
    for (let r = 0; r < R; r++) {
      rects.push([]);
      for (let c = 0; c < C; c++) {
        const wall = rows[r][c] === "*";
        const e = svg("rect", { class: "cell " + (wall ? "obstacle" : "empty"), x: c * cell, y: r * cell, width: cell, height: cell,
          "data-r": r, "data-c": c });
        rects[r].push(e);
        s.append(e);
      }
    }
    const st = stage(s);
    const head = h("p", { class: "draw-caption" });
    box.append(head, st);
    const empty = rows.reduce((n, row) => n + [...row].filter((ch) => ch === ".").length, 0);
    head.textContent = R + "×" + C + " board · " + empty + " empty cells";
    if (why) { banner(st, why, "failed"); return; }
    if (!res || res.moves < 0 || !Array.isArray(res.start)) {
      banner(st, "unsolvable: no game visits every empty cell", "unsolvable");
      box.dataset.outcome = "unsolvable";
      return;
    }
    // Replay the rolls: each moves until the next cell is an obstacle,
    // the border or a cell already visited.
    const seen = rows.map((row) => [...row].map((ch) => ch === "*"));
    let [r, c] = res.start;
    seen[r][c] = true;
    rects[r][c].dataset.roll = "0";
    rects[r][c].classList.add("visited");
    const center = (r, c) => [c * cell + cell / 2, r * cell + cell / 2];
    const points = [center(r, c)];
    const ends = [];
    const path = String(res.path || "");
    for (let i = 0; i < path.length; i++) {
      const [dr, dc] = DIRS[path[i]] || [0, 0];
      let n = 0;
      while (r + dr >= 0 && r + dr < R && c + dc >= 0 && c + dc < C && !seen[r + dr][c + dc]) {
        r += dr; c += dc; n++;
        seen[r][c] = true;
        rects[r][c].dataset.roll = String(i + 1);
        rects[r][c].classList.add("visited");
      }
      if (n === 0) {
        banner(st, "roll " + (i + 1) + " (" + path[i] + ") cannot move: the path does not replay on this board", "failed");
        break;
      }
      points.push(center(r, c));
      ends.push([i + 1, r, c]);
    }
    s.append(svg("polyline", { class: "route", points: points.map((p) => p.join(",")).join(" "),
      "stroke-width": Math.max(2, cell / 6) }));
    const rad = Math.max(6, cell * 0.32);
    const [sx, sy] = points[0];
    s.append(svg("g", { class: "start", "data-r": res.start[0], "data-c": res.start[1] },
      svg("circle", { cx: sx, cy: sy, r: rad }), svgText(sx, sy, "S", { "font-size": Math.round(rad * 1.1) })));
    for (const [n, er, ec] of ends) {
      const [x, y] = center(er, ec);
      s.append(svg("g", { class: "roll", "data-n": n, "data-r": er, "data-c": ec },
        svg("circle", { cx: x, cy: y, r: rad }), svgText(x, y, String(n), { "font-size": Math.round(rad * (n > 9 ? 0.9 : 1.1)) })));
    }
    head.textContent += " · " + res.moves + " roll" + (res.moves === 1 ? "" : "s") + " from row " + (res.start[0] + 1) +
      ", column " + (res.start[1] + 1) + " · path " + path;
  }

  // ---- fill ----

  // colour gives placement i a hue far from its neighbours' (the golden
  // angle), as [r, g, b].
  function colour(i) {
    const hue = (i * 137.508) % 360, s = 0.62, l = 0.56;
    const k = (n) => (n + hue / 30) % 12;
    const a = s * Math.min(l, 1 - l);
    const f = (n) => Math.round(255 * (l - a * Math.max(-1, Math.min(k(n) - 3, 9 - k(n), 1))));
    return [f(0), f(8), f(4)];
  }

  const css = (rgb) => "rgb(" + rgb[0] + "," + rgb[1] + "," + rgb[2] + ")";
  // Typed like the canvas palette, so the pixel loop reads one kind of array.
  const WALL = Uint8Array.of(199, 204, 211), HOLE = Uint8Array.of(255, 255, 255),
    PIECE = Uint8Array.of(232, 235, 239), BLANK = Uint8Array.of(255, 255, 255);

  function fill(box, pz, res, why, opts) {
    const gb = pz.game_board, tb = pz.table, R = gb.length, C = gb[0].length;
    const placements = res && Array.isArray(res.placements) ? res.placements : [];
    const onBoard = new Int32Array(R * C).fill(-1), onTable = new Int32Array(R * C).fill(-1);
    const own = (owner, cells, i) => {
      for (let j = 0; j < cells.length; j++) owner[cells[j][0] * C + cells[j][1]] = i;
    };
    for (let i = 0; i < placements.length; i++) {
      own(onBoard, placements[i].hole || [], i);
      own(onTable, placements[i].piece || [], i);
    }
    const cellRGB = (grid, owner, r, c, full, empty) => {
      const i = owner[r * C + c];
      if (i >= 0) return colour(i);
      return grid[r][c] === 1 ? full : empty;
    };
    const head = h("p", { class: "draw-caption" });
    const canvas = R * C > SVG_MAX_CELLS;
    box.dataset.mode = canvas ? "canvas" : "svg";
    const grids = [];
    let palette = null; // placement i's colour at 3i, for the canvases
    for (const [name, grid, owner, full, empty] of [["game board", gb, onBoard, WALL, HOLE], ["table", tb, onTable, PIECE, BLANK]]) {
      const id = name === "table" ? "fill-table" : "fill-board";
      let pic;
      if (canvas) {
        pic = h("canvas", { id, class: "board fill", width: C, height: R });
        // A million cells: no allocation per cell, the colours looked up.
        if (!palette) {
          palette = new Uint8Array(3 * placements.length);
          placements.forEach((_, i) => palette.set(colour(i), 3 * i));
        }
        const ctx = pic.getContext("2d");
        const img = ctx.createImageData(C, R), d = img.data;
        for (let r = 0, k = 0; r < R; r++) {
          const row = grid[r];
          for (let c = 0; c < C; c++, k++) {
            const i = owner[k], o = 4 * k;
            const src = i >= 0 ? palette : row[c] === 1 ? full : empty, at = i >= 0 ? 3 * i : 0;
            d[o] = src[at]; d[o + 1] = src[at + 1]; d[o + 2] = src[at + 2]; d[o + 3] = 255;
          }
        }
        ctx.putImageData(img, 0, 0);
      } else {
        const cell = cellSize(R, C, 300, 6, 36);
        pic = svg("svg", { id, class: "board fill", viewBox: `0 0 ${C * cell} ${R * cell}`, width: C * cell, height: R * cell, role: "img" });
        for (let r = 0; r < R; r++) {
          for (let c = 0; c < C; c++) {
            const i = owner[r * C + c];
            const a = { class: "cell v" + grid[r][c], x: c * cell, y: r * cell, width: cell, height: cell,
              fill: css(cellRGB(grid, owner, r, c, full, empty)), "data-r": r, "data-c": c };
            if (i >= 0) a["data-p"] = i;
            pic.append(svg("rect", a));
          }
        }
        // Each placement's number on its first cell, where cells are big
        // enough to read it.
        if (cell >= 16) {
          placements.forEach((p, i) => {
            const at = (name === "table" ? p.piece : p.hole) || [];
            if (!at.length) return;
            const [r, c] = at[0];
            pic.append(svgText(c * cell + cell / 2, r * cell + cell / 2, String(i + 1),
              { class: "label", "font-size": Math.round(cell * 0.5) }));
          });
        }
      }
      grids.push(h("figure", {}, pic, h("figcaption", { class: "muted", text: name })));
    }
    const st = stage(h("div", { class: "fill-grids" }, ...grids));
    box.append(head, st);
    head.textContent = R + "×" + C + " grids" + (opts.allow_flip ? " · pieces may be mirrored" : "") +
      (canvas ? " · drawn one pixel per cell" : "");
    if (why) { banner(st, why, "failed"); return; }
    head.textContent = res.filled + " cell" + (res.filled === 1 ? "" : "s") + " filled by " + placements.length +
      " piece" + (placements.length === 1 ? "" : "s") + " · " + head.textContent;
    if (!placements.length) {
      banner(st, "no piece fits any hole", "unsolvable");
      box.dataset.outcome = "unsolvable";
      return;
    }
    const tb2 = h("tbody");
    placements.slice(0, LEGEND_MAX).forEach((p, i) => {
      const sw = h("span", { class: "swatch" });
      sw.style.background = css(colour(i));
      const at = (p.hole || [])[0] || ["?", "?"];
      tb2.append(h("tr", { "data-p": i },
        h("td", {}, sw, String(i + 1)),
        h("td", { text: String((p.piece || []).length) }),
        h("td", { class: "rotation", text: (p.rotation || 0) + "°" + (p.flipped ? ", mirrored" : "") }),
        h("td", { text: "row " + (at[0] + 1) + ", column " + (at[1] + 1) })));
    });
    const legend = h("table", { class: "legend" }, h("thead", {}, h("tr", {},
      h("th", { text: "piece" }), h("th", { text: "cells" }), h("th", { text: "rotation" }), h("th", { text: "hole at" }))), tb2);
    const more = placements.length > LEGEND_MAX ?
      h("p", { class: "muted", text: "and " + (placements.length - LEGEND_MAX) + " more pieces" }) : "";
    // A long list is folded so the drawing stays in view.
    if (placements.length > 12) {
      box.append(h("details", { class: "legend" }, h("summary", { text: "pieces placed (" + placements.length + ")" }), legend, more));
    } else {
      box.append(legend);
    }
  }

  return { render, stop, colour };
})();
