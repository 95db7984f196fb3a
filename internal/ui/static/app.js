// puzzleq dashboard: a client of the v1 API. Every request carries the
// X-Puzzleq-UI header, which the server requires (with the session cookie)
// on requests that change state. Data is shown with textContent only, never
// as markup: custom_ids and error messages come from users.
"use strict";

const UI_HEADER = "X-Puzzleq-UI";
const POLL_MS = 1000;
const MAX_ITEMS = 200; // item rows shown at once
const STATES = ["pending", "active", "completed", "failed", "canceled"];

const $ = (id) => document.getElementById(id);

const app = {
  session: null, // {auth, name}
  selected: null, // selected batch ID
  batches: new Map(), // id -> batch resource
  samples: new Map(), // id -> [{t, ended}] for the rate
  listMode: null, // "list" (GET /v1/batches) or "local" (this browser's IDs)
  timer: null,
  events: null, // EventSource of the selected batch
  itemsAbort: null,
  itemsKey: "",
  missing: new Set(), // endpoints this server lacks
  backoffUntil: 0, // no polls before this time (after a 429)
  gen: 0, // the polling loop's generation: a loop whose is old stops
  item: null, // the item shown: {id, task, req, ended}
};

// api sends a request to this origin and returns {status, body, text}.
async function api(method, path, opts = {}) {
  const headers = Object.assign({ [UI_HEADER]: "1" }, opts.headers || {});
  const init = { method, headers, credentials: "same-origin", signal: opts.signal };
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.json);
  } else if (opts.body !== undefined) {
    init.body = opts.body;
  }
  const resp = await fetch(path, init);
  const text = opts.stream ? "" : await resp.text();
  let body = null;
  if (text) {
    try { body = JSON.parse(text); } catch (_) { body = null; }
  }
  if (resp.status === 429) {
    // Over the key's request rate: the next polls wait as long as asked.
    const secs = Number(resp.headers.get("Retry-After")) || 1;
    app.backoffUntil = Date.now() + secs * 1000;
  }
  if (resp.status === 401 && app.session && app.session.auth && !path.startsWith("/ui/")) {
    signedOut("Your session has ended; sign in again.");
  }
  return { status: resp.status, body, text, resp };
}

// absent reports whether an answer means the route does not exist on this
// server (404 "no such route", or 405 for a path served with other methods).
function absent(r) {
  return r.status === 405 || (r.status === 404 && r.body && r.body.error && /route/.test(r.body.error.message));
}

function errText(r) {
  if (r.body && r.body.error) return r.body.error.code + ": " + r.body.error.message;
  return "HTTP " + r.status;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

// ---- session ----

async function loadSession() {
  const r = await api("GET", "/ui/session");
  if (r.status !== 200 || !r.body) {
    $("global-error").textContent = "cannot reach the API: " + errText(r);
    return;
  }
  app.session = r.body;
  if (app.session.auth && !app.session.name) {
    showSignin();
  } else {
    showDash();
  }
}

function showSignin(msg) {
  stopPolling();
  $("dash").hidden = true;
  $("signin").hidden = false;
  $("signout-btn").hidden = true;
  $("whoami").textContent = "";
  $("signin-error").textContent = msg || "";
  $("key").focus();
}

function signedOut(msg) {
  app.session = { auth: true, name: "" };
  showSignin(msg);
}

function showDash() {
  $("signin").hidden = true;
  $("dash").hidden = false;
  const s = app.session;
  $("whoami").textContent = s.auth ? "signed in as " + s.name : "auth off: no API keys configured";
  $("signout-btn").hidden = !s.auth;
  app.batches.clear();
  app.samples.clear();
  renderJobs();
  startPolling();
  route();
}

async function signIn(ev) {
  ev.preventDefault();
  const key = $("key").value;
  $("signin-error").textContent = "";
  const r = await api("POST", "/ui/session", { json: { key } });
  $("key").value = "";
  if (r.status !== 200) {
    $("signin-error").textContent = r.status === 401 ? "unknown API key" : errText(r);
    return;
  }
  app.session = r.body;
  selectJob(null);
  showDash();
}

async function signOut() {
  await api("DELETE", "/ui/session");
  selectJob(null);
  signedOut("");
}

// ---- this browser's batch IDs, for servers without GET /v1/batches ----

function localKey() {
  return "puzzleq.batches." + (app.session && app.session.name ? app.session.name : "");
}

function localIDs() {
  try { return JSON.parse(localStorage.getItem(localKey()) || "[]"); } catch (_) { return []; }
}

function rememberID(id) {
  const ids = localIDs().filter((x) => x !== id);
  ids.unshift(id);
  localStorage.setItem(localKey(), JSON.stringify(ids.slice(0, 100)));
}

function forgetID(id) {
  localStorage.setItem(localKey(), JSON.stringify(localIDs().filter((x) => x !== id)));
}

// ---- polling ----

function startPolling() {
  stopPolling();
  const gen = app.gen;
  const tick = async () => {
    if (gen !== app.gen) return; // stopped, or replaced by a newer loop
    try {
      $("global-error").textContent = "";
      await Promise.all([refreshJobs(), refreshStatus()]);
      if (app.selected) await refreshJob();
      if (app.item) await refreshItem();
    } catch (e) {
      $("global-error").textContent = String(e);
    }
    const wait = Math.max(POLL_MS, app.backoffUntil - Date.now());
    if (wait > POLL_MS) $("global-error").textContent = "over this key's request rate: polling again in " + fmtDur(wait / 1000);
    if (gen === app.gen && !$("dash").hidden) app.timer = setTimeout(tick, wait);
  };
  tick();
}

function stopPolling() {
  app.gen++;
  if (app.timer) clearTimeout(app.timer);
  app.timer = null;
  closeEvents();
}

// listFrom takes the batches out of a list answer, whatever its envelope.
function listFrom(body) {
  if (Array.isArray(body)) return body;
  for (const k of ["batches", "data", "items"]) if (body && Array.isArray(body[k])) return body[k];
  return [];
}

async function refreshJobs() {
  let list = null;
  if (!app.missing.has("list")) {
    const r = await api("GET", "/v1/batches?limit=50");
    if (r.status === 200) {
      list = listFrom(r.body);
      app.listMode = "list";
    } else if (absent(r)) {
      app.missing.add("list");
    } else if (r.status !== 401) {
      $("global-error").textContent = "list batches: " + errText(r);
    }
  }
  if (list === null) {
    app.listMode = "local";
    const ids = localIDs().slice(0, 20); // within a key's request rate
    list = [];
    await Promise.all(ids.map(async (id) => {
      const r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "?limit=1");
      if (r.status === 200) list.push(r.body);
      else if (r.status === 404) forgetID(id); // expired, or another key's
    }));
    const order = new Map(ids.map((id, i) => [id, i]));
    list.sort((a, b) => order.get(a.id) - order.get(b.id));
  }
  // A list entry may lack counts; fetch those that do.
  await Promise.all(list.map(async (b, i) => {
    if (!b.counts) {
      const r = await api("GET", "/v1/batches/" + encodeURIComponent(b.id) + "?limit=1");
      if (r.status === 200) list[i] = r.body;
    }
  }));
  app.batches = new Map(list.filter((b) => b && b.id).map((b) => [b.id, b]));
  const now = Date.now();
  for (const b of app.batches.values()) sample(b, now);
  renderJobs();
}

// sample keeps the last 30 s of (time, ended) for a batch's rate.
function sample(b, now) {
  const s = app.samples.get(b.id) || [];
  s.push({ t: now, ended: ended(b) });
  while (s.length > 2 && now - s[0].t > 30000) s.shift();
  app.samples.set(b.id, s);
}

function ended(b) {
  const c = b.counts || {};
  return (c.completed || 0) + (c.failed || 0) + (c.canceled || 0);
}

// rate is items ended per second: from the done batch's whole run, from
// recent samples while it runs, or, with one sample, since it was created.
function rate(b) {
  const created = b.created_at ? Date.parse(b.created_at) : NaN;
  if (b.done && b.done_at && !isNaN(created)) {
    const secs = Math.max((Date.parse(b.done_at) - created) / 1000, 0.001);
    return ended(b) / secs;
  }
  const s = app.samples.get(b.id) || [];
  if (s.length >= 2 && s[s.length - 1].t - s[0].t >= 1000) {
    const a = s[0], z = s[s.length - 1];
    return (z.ended - a.ended) / ((z.t - a.t) / 1000);
  }
  if (!isNaN(created)) return ended(b) / Math.max((Date.now() - created) / 1000, 0.001);
  return 0;
}

function fmtRate(r) {
  if (!isFinite(r) || r <= 0) return "–";
  if (r >= 100) return Math.round(r) + "/s";
  if (r >= 1) return r.toFixed(1) + "/s";
  return (r * 60).toFixed(1) + "/min";
}

function fmtDur(secs) {
  if (!isFinite(secs) || secs < 0) return "–";
  if (secs < 60) return Math.ceil(secs) + " s";
  if (secs < 3600) return Math.floor(secs / 60) + " min " + Math.round(secs % 60) + " s";
  return Math.floor(secs / 3600) + " h " + Math.round((secs % 3600) / 60) + " min";
}

function eta(b) {
  if (b.done) return "done";
  const left = (b.total || 0) - ended(b);
  const r = rate(b);
  if (r <= 0) return "–";
  return fmtDur(left / r);
}

function fmtTime(s) {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}

function short(id) {
  return id.length > 12 ? id.slice(0, 8) + "…" : id;
}

function bar(b, big) {
  const div = el("div", { class: "bar" + (big ? " big" : "") });
  const total = Math.max(b.total || 0, 1);
  const c = b.counts || {};
  for (const st of ["completed", "failed", "canceled", "active"]) {
    if (!c[st]) continue;
    const seg = el("span", { class: "seg " + st, title: st + " " + c[st] });
    seg.style.width = (100 * c[st] / total) + "%";
    div.append(seg);
  }
  div.setAttribute("data-pct", String(Math.round(100 * ended(b) / total)));
  div.title = ended(b) + " of " + (b.total || 0) + " ended";
  return div;
}

function countsText(b) {
  const c = b.counts || {};
  return STATES.filter((s) => c[s]).map((s) => s + " " + c[s]).join(", ") || "no items";
}

function stateOf(b) {
  if (!b.done) return "running";
  const c = b.counts || {};
  if (c.failed) return "done, " + c.failed + " failed";
  if (c.canceled) return "done, " + c.canceled + " canceled";
  return "done";
}

function renderJobs() {
  const tb = $("jobs").querySelector("tbody");
  tb.replaceChildren();
  for (const b of app.batches.values()) {
    const link = el("a", { href: "#" + b.id, text: short(b.id), title: b.id });
    link.addEventListener("click", (ev) => {
      ev.preventDefault();
      if (location.hash !== "#" + b.id) location.hash = "#" + b.id; // route selects it
      else selectJob(b.id);
    });
    const tr = el("tr", { "data-id": b.id, "data-done": String(!!b.done) },
      el("td", {}, link),
      el("td", { text: fmtTime(b.created_at) }),
      el("td", { class: "wide" }, bar(b, false)),
      el("td", { class: "counts", text: countsText(b) }),
      el("td", { text: fmtRate(rate(b)) }),
      el("td", { text: eta(b) }),
      el("td", { class: "state", text: stateOf(b) }));
    if (b.id === app.selected) tr.className = "selected";
    tb.append(tr);
  }
  $("jobs-empty").hidden = app.batches.size > 0;
  $("jobs-source").textContent = app.listMode === "local" ? "(submitted from this browser)" : "";
}

// ---- status ----

async function refreshStatus() {
  if (app.missing.has("status")) return;
  const r = await api("GET", "/v1/status");
  if (absent(r)) {
    app.missing.add("status");
    $("status").replaceChildren(el("span", { class: "muted", text: "This server has no /v1/status." }));
    return;
  }
  if (r.status !== 200 || !r.body) return;
  renderStatus(r.body);
}

// renderStatus shows GET /v1/status (apitype.ServiceStatus): the live
// workers with their slots and what they run, and the queues' depths.
function renderStatus(s) {
  const box = $("status");
  const alive = s.workers_alive ?? 0;
  const queues = Array.isArray(s.queues) ? s.queues : [];
  const waiting = queues.reduce((n, q) => n + (q.waiting ?? 0), 0);
  const parts = [el("p", { class: alive === 0 ? "error" : "" },
    el("strong", { id: "workers-alive", text: String(alive) }),
    " worker" + (alive === 1 ? "" : "s") + " alive" + (alive === 0 ? ": nothing runs until one starts" : "") +
    " · " + (s.busy ?? 0) + " of " + (s.slots ?? 0) + " slots busy" +
    (waiting ? " · " + waiting + " waiting for a slot" : "") +
    " · oldest pending " + (s.oldest_pending_seconds ? fmtDur(s.oldest_pending_seconds) : "none") +
    (s.backlog_units ? " · about " + s.backlog_units + " batch units in the feed" : ""))];
  const workers = Array.isArray(s.workers) ? s.workers : [];
  if (workers.length) {
    const tb = el("tbody");
    for (const w of workers) {
      const running = Object.entries(w.running || {}).map(([k, n]) => k + " " + n).join(", ");
      tb.append(el("tr", {},
        el("td", { class: "mono", text: (w.host || w.id || "") + (w.pid ? ":" + w.pid : "") }),
        el("td", { text: (w.busy ?? 0) + " / " + (w.slots ?? 0) }),
        el("td", { text: running || "idle" }),
        el("td", { text: fmtTime(w.started_at) })));
    }
    parts.push(el("table", { id: "workers" }, el("thead", {}, el("tr", {},
      el("th", { text: "worker" }), el("th", { text: "busy / slots" }), el("th", { text: "running" }), el("th", { text: "started" }))), tb));
  }
  if (queues.length) {
    const tb = el("tbody");
    for (const q of queues) {
      tb.append(el("tr", { "data-queue": q.name || "" },
        el("td", { text: q.name || "" }),
        el("td", { class: "pending", text: String(q.pending ?? 0) }),
        el("td", { text: String(q.active ?? 0) }),
        el("td", { class: "waiting", text: String(q.waiting ?? 0) }),
        el("td", { class: "retry", text: String(q.retry ?? 0) }),
        el("td", { text: q.oldest_pending_seconds ? fmtDur(q.oldest_pending_seconds) : "–" })));
    }
    parts.push(el("table", { id: "queues" }, el("thead", {}, el("tr", {},
      el("th", { text: "queue" }), el("th", { text: "pending" }), el("th", { text: "active" }),
      el("th", { text: "waiting", title: "expensive runs waiting for a solver slot: nothing failed" }),
      el("th", { text: "retry", title: "tasks retried after an error" }),
      el("th", { text: "oldest pending" }))), tb));
  }
  box.replaceChildren(...parts);
}

// ---- one job ----

function selectJob(id) {
  app.selected = id;
  closeEvents();
  app.itemsKey = "";
  if (app.itemsAbort) app.itemsAbort.abort();
  $("job").hidden = !id;
  $("job-msg").textContent = "";
  if (!id) return;
  $("job-id").textContent = id;
  setLive("polling");
  $("download").href = "/v1/batches/" + encodeURIComponent(id) + "/results";
  $("download").setAttribute("download", id + ".results.ndjson");
  renderJobs();
  openEvents(id);
  refreshJob();
}

// openEvents follows the batch's Server-Sent Events where the server has
// them (progress, item and done events): each prompts a refresh, so the
// view changes as items end; polling goes on anyway, more slowly. A
// stream that ends is reopened by EventSource from its last event ID; one
// that fails before it opened means the route is absent here.
function openEvents(id) {
  if (app.missing.has("events") || typeof EventSource === "undefined") return;
  const es = new EventSource("/v1/batches/" + encodeURIComponent(id) + "/events");
  let opened = false;
  es.onopen = () => {
    opened = true;
    if (app.selected === id) setLive("events");
  };
  const poke = () => { if (app.selected === id) refreshJobSoon(); };
  for (const type of ["message", "progress", "item"]) es.addEventListener(type, poke);
  es.addEventListener("done", () => { poke(); es.close(); if (app.events === es) app.events = null; });
  es.onerror = () => {
    if (es.readyState !== EventSource.CLOSED) return; // reconnecting by itself
    if (!opened) app.missing.add("events");
    if (app.events === es) app.events = null;
  };
  app.events = es;
}

// setLive says how the job's view is kept current: "events" once its
// event stream opened, else "polling".
function setLive(how) {
  $("job").dataset.live = how;
  $("job-live").textContent = how === "events" ? "live" : "polling";
}

function closeEvents() {
  if (app.events) app.events.close();
  app.events = null;
}

let soon = null;
function refreshJobSoon() {
  if (soon) return;
  soon = setTimeout(() => { soon = null; refreshJob(); }, 200);
}

async function refreshJob() {
  const id = app.selected;
  if (!id) return;
  const r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "?limit=1");
  if (app.selected !== id) return;
  if (r.status === 404) {
    $("job-msg").textContent = "no such batch (expired, or another key's)";
    forgetID(id);
    return;
  }
  if (r.status !== 200) return;
  const b = r.body;
  sample(b, Date.now());
  if (app.batches.has(id)) {
    // Keep the job's row in step with its view.
    app.batches.set(id, Object.assign(app.batches.get(id), { counts: b.counts, done: b.done, done_at: b.done_at }));
    renderJobs();
  }
  $("job-bar").replaceWith(Object.assign(bar(b, true), { id: "job-bar" }));
  $("job-counts").textContent = countsText(b) + " · " + (b.total || 0) + " items · " +
    fmtRate(rate(b)) + " · ETA " + eta(b) + " · " + stateOf(b);
  $("job").setAttribute("data-done", String(!!b.done));
  $("cancel-btn").disabled = !!b.done;
  const c = b.counts || {};
  $("retry-btn").disabled = !((c.failed || 0) + (c.canceled || 0)) || app.missing.has("retry");
  // Reload the items when the filter or the counts change.
  const key = id + "|" + $("state-filter").value + "|" + JSON.stringify(c);
  if (key !== app.itemsKey) {
    app.itemsKey = key;
    loadItems(id, $("state-filter").value);
  }
}

// loadItems shows up to MAX_ITEMS items of the batch in one state (or
// all): from GET /v1/batches/{id}/items where the server has it, else
// from the results stream, one NDJSON line per item.
async function loadItems(id, state) {
  if (app.itemsAbort) app.itemsAbort.abort();
  const ctl = new AbortController();
  app.itemsAbort = ctl;
  if (!app.missing.has("items")) {
    const q = "?limit=" + MAX_ITEMS + (state ? "&state=" + encodeURIComponent(state) : "");
    let r;
    try {
      r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "/items" + q, { signal: ctl.signal });
    } catch (e) {
      if (e.name === "AbortError") return;
      throw e;
    }
    if (app.selected !== id || ctl.signal.aborted) return;
    if (r.status === 200 && r.body && Array.isArray(r.body.tasks)) {
      const rows = r.body.tasks.map((t) => ({ index: itemIndex(t.id), id: t.id, custom_id: t.custom_id,
        state: t.state, result: t.result, error: t.error }));
      renderItems(rows, !!r.body.next_cursor);
      return;
    }
    if (!absent(r)) {
      $("items-note").textContent = "items: " + errText(r);
      return;
    }
    app.missing.add("items");
  }
  await loadResults(id, state, ctl);
}

// itemIndex is the index in an item ID "<batch>-<index>".
function itemIndex(id) {
  const i = id.lastIndexOf("-");
  return i < 0 ? "" : Number(id.slice(i + 1));
}

async function loadResults(id, state, ctl) {
  const q = state ? "?state=" + encodeURIComponent(state) : "";
  const rows = [];
  let more = false;
  try {
    const r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "/results" + q, { signal: ctl.signal, stream: true });
    if (r.status !== 200) {
      $("items-note").textContent = "items: HTTP " + r.status;
      return;
    }
    const reader = r.resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (value) buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        if (rows.length >= MAX_ITEMS) { more = true; break; }
        try { rows.push(JSON.parse(line)); } catch (_) { /* a torn line: skip */ }
      }
      if (more || done) break;
    }
    if (more) ctl.abort();
  } catch (e) {
    if (e.name === "AbortError" && !more) return; // replaced by a newer load
  }
  if (app.selected !== id) return;
  renderItems(rows, more);
}

function renderItems(rows, more) {
  const tb = $("items").querySelector("tbody");
  tb.replaceChildren();
  for (const it of rows) {
    let out = "";
    if (it.error) out = it.error.code + ": " + it.error.message;
    else if (it.result !== undefined && it.result !== null) out = JSON.stringify(it.result);
    tb.append(el("tr", { "data-state": it.state, "data-id": it.id },
      el("td", { text: String(it.index) }),
      el("td", { class: "mono" }, el("a", { href: itemHash(it.id), text: it.id, title: "draw this item" })),
      el("td", { class: "custom-id", text: it.custom_id ?? "" }),
      el("td", { class: "state " + it.state, text: it.state }),
      el("td", { class: it.error ? "mono error" : "mono", text: out })));
  }
  $("items-note").textContent = more ? "showing the first " + rows.length + "; download for all" :
    rows.length + " item" + (rows.length === 1 ? "" : "s");
}

// ---- one item, drawn ----

// An item's drawing has its own URL, /ui/#/items/<id>: route shows what
// the URL's fragment names, an item or a batch (#<batch id>).
const ITEM_HASH = "#/items/";

function itemHash(id) {
  return ITEM_HASH + encodeURIComponent(id);
}

function route() {
  if ($("dash").hidden) return;
  const hash = location.hash;
  if (hash.startsWith(ITEM_HASH)) {
    let id = hash.slice(ITEM_HASH.length);
    try { id = decodeURIComponent(id); } catch (_) { /* a malformed escape: look it up as typed */ }
    openItem(id);
    return;
  }
  closeItem();
  const id = hash.slice(1);
  if (/^[0-9a-f]{32}$/.test(id) && id !== app.selected) selectJob(id);
}

function closeItem() {
  app.item = null;
  Draw.stop();
  $("item").hidden = true;
  $("drawing").replaceChildren();
}

// openItem reads a task (a batch item or a single task) and what it was
// asked to solve, and draws it.
async function openItem(id) {
  if (app.item && app.item.id === id) return;
  app.item = { id, task: null, req: null, noPuzzle: false, ended: false, busy: false };
  Draw.stop();
  $("item").hidden = false;
  $("item").dataset.id = id;
  $("item").removeAttribute("data-ready");
  $("item-id").textContent = id;
  $("item-meta").textContent = "loading…";
  $("item-msg").textContent = "";
  $("item-json").textContent = "";
  $("drawing").replaceChildren();
  const batch = id.includes("-") ? id.slice(0, id.lastIndexOf("-")) : "";
  $("item-batch").textContent = batch ? "of batch " + short(batch) : "";
  $("item-batch").href = batch ? "#" + batch : "#";
  $("item-batch").hidden = !batch;
  $("item").scrollIntoView({ block: "start" });
  await refreshItem();
}

// itemWanted reports whether the open item has more to read: its end,
// or a puzzle or task that a busy server (429, 503) did not give yet.
function itemWanted(it) {
  return !it.task || !it.ended || (!it.req && !it.noPuzzle);
}

async function refreshItem() {
  const it = app.item;
  if (!it || it.busy || !itemWanted(it)) return;
  it.busy = true;
  try {
    await readItem(it);
  } finally {
    it.busy = false;
  }
}

// readItem reads what the open item still needs, one request at a time:
// a large fill's puzzle and result are megabytes each, and a server whose
// memory for answers is taken answers 503 (the polling loop tries again).
async function readItem(it) {
  const path = "/v1/tasks/" + encodeURIComponent(it.id);
  let redraw = false;
  if (!it.req && !it.noPuzzle) {
    const pr = await api("GET", path + "/puzzle");
    if (app.item !== it) return;
    if (pr.status === 200) {
      it.req = pr.body;
      redraw = true;
      $("item-msg").textContent = "";
    } else if (pr.status === 404 || (pr.status >= 400 && pr.status < 500 && pr.status !== 429)) {
      it.noPuzzle = true; // not kept (a single task's), or gone
      $("item-msg").textContent = "no drawing: " + (pr.body && pr.body.error ? pr.body.error.message : errText(pr));
    } else {
      $("item-msg").textContent = "the puzzle could not be read (" + errText(pr) + "); trying again";
    }
  }
  if (!it.task || !it.ended) {
    const tr = await api("GET", path);
    if (app.item !== it) return;
    if (tr.status === 404 || (tr.status !== 200 && !it.task && tr.status < 500 && tr.status !== 429)) {
      it.ended = true;
      it.noPuzzle = true; // nothing more to read
      it.task = it.task || { state: "unknown" };
      $("item-meta").textContent = "";
      $("item-msg").textContent = tr.status === 404 ? "no such item or task (expired, or another key's)" : errText(tr);
      $("drawing").replaceChildren();
      $("item").dataset.ready = "error";
      return;
    }
    if (tr.status === 200 && tr.body) {
      const t = tr.body;
      redraw = redraw || !it.task || it.task.state !== t.state;
      it.task = t;
      it.ended = ["completed", "failed", "canceled"].includes(t.state);
      $("item-meta").textContent = [t.kind, t.state, t.custom_id ? "custom_id " + t.custom_id : "",
        t.attempts ? t.attempts + " attempt" + (t.attempts === 1 ? "" : "s") : "", t.cached ? "from the cache" : "",
        t.completed_at ? "ended " + fmtTime(t.completed_at) : ""].filter(Boolean).join(" · ");
      $("item-json").textContent = t.error ? JSON.stringify(t.error, null, 1) : JSON.stringify(t.result);
    } else if (!it.task) {
      $("item-meta").textContent = "the item could not be read (" + errText(tr) + "); trying again";
    }
  }
  if (!redraw || !it.task) return;
  Draw.render($("drawing"), it.task, it.req);
  // Ready once drawn with its puzzle, or once no puzzle is to come.
  if (it.req || it.noPuzzle) $("item").dataset.ready = it.task.state;
}

async function openByID(ev) {
  ev.preventDefault();
  const id = $("open-id").value.trim();
  if (!id) return;
  location.hash = itemHash(id);
}

async function cancelJob() {
  const id = app.selected;
  if (!id) return;
  const r = await api("DELETE", "/v1/batches/" + encodeURIComponent(id));
  $("job-msg").textContent = r.status === 200 ? "canceled " + r.body.canceled + " items" : "cancel: " + errText(r);
  refreshJob();
}

async function retryJob() {
  const id = app.selected;
  if (!id) return;
  const r = await api("POST", "/v1/batches/" + encodeURIComponent(id) + "/retry");
  if (absent(r)) {
    app.missing.add("retry");
    $("job-msg").textContent = "this server cannot retry items";
    $("retry-btn").disabled = true;
    return;
  }
  if (r.status >= 200 && r.status < 300) {
    const n = r.body && r.body.retried;
    $("job-msg").textContent = "retrying" + (n !== undefined ? " " + n + " items" : "");
  } else {
    $("job-msg").textContent = "retry: " + errText(r);
  }
  app.samples.delete(id);
  closeEvents();
  openEvents(id);
  refreshJob();
}

async function submitBatch() {
  const text = $("ndjson").value.trim();
  const msg = $("submit-msg");
  if (!text) { msg.textContent = "paste at least one line"; return; }
  $("submit-btn").disabled = true;
  msg.textContent = "submitting…";
  try {
    const r = await api("POST", "/v1/batches", { body: text + "\n", headers: { "Content-Type": "application/x-ndjson" } });
    if (r.status === 202 || r.status === 200) {
      msg.textContent = "submitted " + r.body.total + " items as " + r.body.id;
      msg.setAttribute("data-id", r.body.id);
      rememberID(r.body.id);
      selectJob(r.body.id);
      refreshJobs();
    } else {
      msg.textContent = errText(r) + (r.body && r.body.error && r.body.error.field ? " (" + r.body.error.field + ")" : "");
    }
  } finally {
    $("submit-btn").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", signIn);
  $("signout-btn").addEventListener("click", signOut);
  $("submit-btn").addEventListener("click", submitBatch);
  $("cancel-btn").addEventListener("click", cancelJob);
  $("retry-btn").addEventListener("click", retryJob);
  $("state-filter").addEventListener("change", () => { app.itemsKey = ""; refreshJob(); });
  $("open-form").addEventListener("submit", openByID);
  window.addEventListener("hashchange", route);
  loadSession();
});
