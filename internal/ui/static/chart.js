// puzzleq dashboard: history charted. Chart.render(box, history) draws a
// GET /v1/history answer ({scope, minutes: [{time, completed, failed,
// singles, p50_ms, p90_ms, p99_ms, pending}]}) into box as three SVG
// panels over the same minutes: tasks ended per minute (completed and
// failed, stacked), single tasks' latency (p50 and p99, log scale), and
// tasks not ended. Each bar and point carries its figures in data-*
// attributes and a <title>, so tests and screen readers read them as
// they are drawn. Text goes in with textContent only.
"use strict";

const Chart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 720, H = 120, LEFT = 56, RIGHT = 8, TOP = 18, BOTTOM = 18;
  const SPAN = H - TOP - BOTTOM; // the plot's height

  function svg(tag, attrs = {}, ...kids) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    for (const k of kids) e.append(k);
    return e;
  }

  function text(x, y, s, attrs = {}) {
    const t = svg("text", Object.assign({ x, y }, attrs));
    t.textContent = s;
    return t;
  }

  function titled(el, s) {
    const t = svg("title");
    t.textContent = s;
    el.append(t);
    return el;
  }

  function hhmm(iso) {
    const d = new Date(iso);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }

  function fmt(n) {
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e4) return Math.round(n / 1e3) + "k";
    return String(n);
  }

  // panel is one chart: a frame, its title, the y axis's top label and the
  // first and last minutes on the x axis.
  function panel(name, title, top, pts) {
    const g = svg("svg", { class: "chart chart-" + name, viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "data-chart": name });
    titled(g, title);
    g.append(text(LEFT, 12, title, { class: "chart-title" }));
    g.append(text(LEFT - 4, TOP + 4, top, { class: "chart-axis", "text-anchor": "end" }));
    g.append(text(LEFT - 4, H - BOTTOM, "0", { class: "chart-axis", "text-anchor": "end" }));
    g.append(svg("line", { x1: LEFT, y1: H - BOTTOM, x2: W - RIGHT, y2: H - BOTTOM, class: "chart-base" }));
    if (pts.length > 0) {
      g.append(text(LEFT, H - 4, hhmm(pts[0].time), { class: "chart-axis" }));
      g.append(text(W - RIGHT, H - 4, hhmm(pts[pts.length - 1].time), { class: "chart-axis", "text-anchor": "end" }));
    }
    return g;
  }

  function x(i, n) {
    const step = (W - LEFT - RIGHT) / Math.max(n, 1);
    return { x: LEFT + i * step, w: Math.max(step - 1, 1) };
  }

  function throughput(pts) {
    const max = Math.max(1, ...pts.map((p) => p.completed + p.failed));
    const g = panel("throughput", "Tasks ended per minute (completed, failed)", fmt(max), pts);
    pts.forEach((p, i) => {
      const { x: bx, w } = x(i, pts.length);
      const hc = (p.completed / max) * SPAN, hf = (p.failed / max) * SPAN;
      const label = `${hhmm(p.time)}: ${p.completed} completed, ${p.failed} failed`;
      if (p.completed > 0) {
        g.append(titled(svg("rect", { x: bx, y: H - BOTTOM - hc, width: w, height: hc, class: "bar-completed",
          "data-minute": p.time, "data-value": p.completed }), label));
      }
      if (p.failed > 0) {
        g.append(titled(svg("rect", { x: bx, y: H - BOTTOM - hc - hf, width: w, height: hf, class: "bar-failed",
          "data-minute": p.time, "data-value": p.failed }), label));
      }
    });
    return g;
  }

  // line draws the non-null values of key as a polyline with a dot per
  // point, y from scale(value) in [0, 1].
  function line(g, pts, key, cls, scale, unit) {
    const coords = [];
    pts.forEach((p, i) => {
      const v = p[key];
      if (v === null || v === undefined) return;
      const { x: bx, w } = x(i, pts.length);
      const cx = bx + w / 2, cy = H - BOTTOM - scale(v) * SPAN;
      coords.push(cx.toFixed(1) + "," + cy.toFixed(1));
      g.append(titled(svg("circle", { cx, cy, r: 2.5, class: cls, "data-minute": p.time, "data-value": v }),
        `${hhmm(p.time)}: ${key.replace("_ms", "")} ${fmt(v)}${unit}`));
    });
    if (coords.length > 1) g.append(svg("polyline", { points: coords.join(" "), class: cls, fill: "none" }));
  }

  function latency(pts) {
    // Log scale from 1 ms to a minute: the buckets the workers count in.
    const lo = Math.log10(1), hi = Math.log10(60000);
    const scale = (v) => (Math.log10(Math.max(v, 1)) - lo) / (hi - lo);
    const g = panel("latency", "Single tasks' latency, ms (log scale)", "60000", pts);
    g.append(text(W - RIGHT - 60, 12, "● p50", { class: "chart-axis legend-p50", "text-anchor": "end" }));
    g.append(text(W - RIGHT, 12, "● p99", { class: "chart-axis legend-p99", "text-anchor": "end" }));
    line(g, pts, "p50_ms", "line-p50", scale, " ms");
    line(g, pts, "p99_ms", "line-p99", scale, " ms");
    return g;
  }

  function pending(pts) {
    const max = Math.max(1, ...pts.map((p) => p.pending || 0));
    const g = panel("pending", "Tasks not ended", fmt(max), pts);
    line(g, pts, "pending", "line-pending", (v) => v / max, "");
    return g;
  }

  function render(box, history) {
    const pts = history.minutes || [];
    let completed = 0, failed = 0;
    for (const p of pts) {
      completed += p.completed;
      failed += p.failed;
    }
    const who = history.scope === "all" ? "every key" : "this key";
    const sum = document.createElement("p");
    sum.className = "muted chart-summary";
    sum.textContent = `${completed} completed, ${failed} failed in the last ${pts.length} minutes (${who}).`;
    box.replaceChildren(sum, throughput(pts), latency(pts), pending(pts));
  }

  return { render };
})();
