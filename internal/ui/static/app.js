// puzzleq dashboard: a client of the v1 API. Every request carries the
// X-Puzzleq-UI header, which the server requires (with the session cookie)
// on requests that change state. Data is shown with textContent only, never
// as markup: custom_ids and error messages come from users.
"use strict";

const UI_HEADER = "X-Puzzleq-UI";
const POLL_MS = 1000;
const MAX_ITEMS = 200; // item rows read from the results stream, without GET /items
const PAGE_ITEMS = 100; // item rows a page of a job's items holds
const MAX_TASKS = 50; // single tasks listed
const STATES = ["pending", "active", "completed", "failed", "canceled"];

const $ = (id) => document.getElementById(id);

const app = {
  session: null, // {auth, name}
  view: null, // the view shown: {name, arg}
  job: null, // the job view's state: see newJob
  lastJob: null, // the job view left last, to come back to its page
  batches: new Map(), // id -> batch resource
  tasks: [], // the key's single tasks, newest first
  samples: new Map(), // id -> [{t, worked}] for the rate
  listMode: null, // "list" (GET /v1/batches) or "local" (this browser's IDs)
  timer: null,
  events: null, // EventSource of the selected batch
  itemsAbort: null,
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

// plural writes a count and its noun: "1 item", "2 items".
function plural(n, noun) {
  return n + " " + noun + (n === 1 ? "" : "s");
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
  leaveView();
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
  app.tasks = [];
  renderJobs();
  renderTasks();
  // The loop first: starting it stops an older one, and its event stream.
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
  app.lastJob = null;
  showDash();
}

async function signOut() {
  await api("DELETE", "/ui/session");
  app.lastJob = null;
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
      await refreshView();
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

// sample keeps the last 30 s of (time, worked) for a batch's rate.
function sample(b, now) {
  const s = app.samples.get(b.id) || [];
  s.push({ t: now, worked: worked(b) });
  while (s.length > 2 && now - s[0].t > 30000) s.shift();
  app.samples.set(b.id, s);
}

function ended(b) {
  const c = b.counts || {};
  return (c.completed || 0) + (c.failed || 0) + (c.canceled || 0);
}

// worked counts the items a worker ended, completed or failed: a cancel
// ends thousands of items at once, and counting them would show a rate
// the workers never had.
function worked(b) {
  const c = b.counts || {};
  return (c.completed || 0) + (c.failed || 0);
}

// rate is items worked per second (canceled ones are not: see worked):
// from the done batch's whole run, from recent samples while it runs, or,
// with one sample, since it was created.
function rate(b) {
  const created = b.created_at ? Date.parse(b.created_at) : NaN;
  if (b.done && b.done_at && !isNaN(created)) {
    const secs = Math.max((Date.parse(b.done_at) - created) / 1000, 0.001);
    return worked(b) / secs;
  }
  const s = app.samples.get(b.id) || [];
  if (s.length >= 2 && s[s.length - 1].t - s[0].t >= 1000) {
    const a = s[0], z = s[s.length - 1];
    return Math.max(z.worked - a.worked, 0) / ((z.t - a.t) / 1000);
  }
  if (!isNaN(created)) return worked(b) / Math.max((Date.now() - created) / 1000, 0.001);
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
    const link = el("a", { href: jobHash(b.id), text: short(b.id), title: b.id });
    const tr = el("tr", { "data-id": b.id, "data-done": String(!!b.done) },
      el("td", {}, link),
      el("td", { text: fmtTime(b.created_at) }),
      el("td", { class: "wide" }, bar(b, false)),
      el("td", { class: "counts", text: countsText(b) }),
      el("td", { class: "rate", text: fmtRate(rate(b)) }),
      el("td", { text: eta(b) }),
      el("td", { class: "state", text: stateOf(b) }));
    if (app.job && b.id === app.job.id) tr.className = "selected";
    tb.append(tr);
  }
  $("jobs-empty").hidden = app.batches.size > 0;
  $("jobs-source").textContent = app.listMode === "local" ? "(submitted from this browser)" : "";
}

// ---- single tasks ----

// refreshTasks reads the key's single tasks (GET /v1/tasks), newest
// first; a batch's items are not among them.
async function refreshTasks() {
  if (app.missing.has("tasks")) return;
  const r = await api("GET", "/v1/tasks?limit=" + MAX_TASKS);
  if (absent(r)) {
    app.missing.add("tasks");
    app.tasks = [];
    $("tasks-note").textContent = "(this server does not list them)";
    renderTasks();
    return;
  }
  if (r.status !== 200 || !r.body || !Array.isArray(r.body.tasks)) return;
  app.tasks = r.body.tasks;
  $("tasks-note").textContent = r.body.next_cursor ? "(the newest " + app.tasks.length + ")" : "";
  renderTasks();
}

function renderTasks() {
  const tb = $("tasks").querySelector("tbody");
  tb.replaceChildren();
  for (const t of app.tasks) {
    tb.append(el("tr", { "data-id": t.id, "data-state": t.state },
      el("td", { class: "mono" }, el("a", { href: itemHash(t.id), text: t.id, title: "draw this task" })),
      el("td", { text: t.kind || "" }),
      el("td", { text: fmtTime(t.created_at) }),
      el("td", { class: "state " + t.state, text: t.state }),
      el("td", { class: t.error ? "mono error" : "mono", text: outcomeText(t) })));
  }
  $("tasks-empty").hidden = app.tasks.length > 0 || app.missing.has("tasks");
}

// outcomeText is a task's result as JSON, or its error, in one line.
function outcomeText(t) {
  if (t.error) return t.error.code + ": " + t.error.message;
  if (t.result !== undefined && t.result !== null) return JSON.stringify(t.result);
  return "";
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
    " · " + (s.busy ?? 0) + " of " + plural(s.slots ?? 0, "slot") + " busy" +
    (waiting ? " · " + waiting + " waiting for a slot" : "") +
    " · oldest pending " + (s.oldest_pending_seconds ? fmtDur(s.oldest_pending_seconds) : "none") +
    (s.backlog_units ? " · about " + plural(s.backlog_units, "batch unit") + " in the feed" : ""))];
  const workers = Array.isArray(s.workers) ? s.workers : [];
  if (workers.length) {
    const tb = el("tbody");
    for (const w of workers) {
      const running = Object.entries(w.running || {}).map(([k, n]) => k + " " + n).join(", ");
      tb.append(el("tr", { class: w.draining ? "draining" : "" },
        el("td", { class: "mono", text: w.id || "" }),
        el("td", { text: (w.busy ?? 0) + " / " + (w.slots ?? 0) }),
        el("td", { text: (w.draining ? "draining: " : "") + (running || "idle") }),
        el("td", { text: fmtTime(w.started_at) })));
    }
    parts.push(el("table", { id: "workers" }, el("thead", {}, el("tr", {},
      el("th", { text: "worker", title: "its name, the worker_id of its logs; its host and pid are the operator's" }), el("th", { text: "busy / slots" }), el("th", { text: "running" }), el("th", { text: "started" }))), tb));
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

// ---- views ----

// The dashboard shows one view at a time, each at its own URL: ROUTES
// maps a URL fragment to a view (the first pattern that matches wins, its
// group is the view's argument), VIEWS says how a view starts, stops and
// keeps current, and the view's element is the one whose data-view names
// it. A new view is a route, a VIEWS entry, an element and a nav link.
const ITEM_HASH = "#/items/";
const JOB_HASH = "#/jobs/";

const ROUTES = [
  { pattern: /^#?\/?$/, view: "jobs" }, // no fragment: the default
  { pattern: /^#\/jobs\/?$/, view: "jobs" },
  { pattern: /^#\/jobs\/([^/]+)$/, view: "job" },
  { pattern: /^#\/items\/(.+)$/, view: "item" },
  { pattern: /^#\/workers\/?$/, view: "workers" },
  { pattern: /^#\/history\/?$/, view: "history" },
  // A job's links from before the views, #<batch id>, still open it; the
  // URL becomes the job's own.
  { pattern: /^#([0-9a-f]{32})$/, view: "job", canonical: (id) => jobHash(id) },
];

const VIEWS = {
  jobs: { nav: "jobs", enter() {}, leave() {}, refresh: () => Promise.all([refreshJobs(), refreshTasks()]) },
  job: { nav: "jobs", enter: selectJob, leave: leaveJob, refresh: refreshJob },
  item: { nav: "jobs", enter: openItem, leave: closeItem, refresh: refreshItem },
  workers: { nav: "workers", enter() {}, leave() {}, refresh: refreshStatus },
  history: { nav: "history", enter() { app.historyAt = 0; }, leave() {}, refresh: refreshHistory },
};

// HISTORY_MS is how often the history view reads GET /v1/history: its
// figures change every few seconds (HISTORY_INTERVAL), not every poll.
const HISTORY_MS = 5000;

// refreshHistory charts the last hour (chart.js) when HISTORY_MS has
// passed since the view last read it.
async function refreshHistory() {
  if (Date.now() - (app.historyAt || 0) < HISTORY_MS) return;
  app.historyAt = Date.now();
  const r = await api("GET", "/v1/history?minutes=60");
  if (!app.view || app.view.name !== "history") return;
  if (r.status === 200 && r.body) {
    Chart.render($("history-charts"), r.body);
  } else if (r.status !== 401) {
    $("history-charts").replaceChildren(el("p", { class: "error" }, "history unavailable: " + errText(r)));
  }
}

function itemHash(id) {
  return ITEM_HASH + encodeURIComponent(id);
}

function jobHash(id) {
  return JOB_HASH + encodeURIComponent(id);
}

// match finds the route of a URL fragment: {view, arg, canonical}, or null.
function match(hash) {
  for (const r of ROUTES) {
    const m = r.pattern.exec(hash);
    if (!m) continue;
    let arg = m[1] ?? null;
    if (arg !== null) {
      try { arg = decodeURIComponent(arg); } catch (_) { /* a malformed escape: look it up as typed */ }
    }
    return { view: r.view, arg, canonical: r.canonical ? r.canonical(arg) : null };
  }
  return null;
}

// route shows the view that the URL's fragment names: on sign-in, and on
// every hashchange (links, Back and Forward, a typed URL).
function route() {
  if ($("dash").hidden) return;
  let m = match(location.hash);
  if (!m) {
    $("search-msg").textContent = "no view at " + location.hash + ": showing the jobs";
    m = { view: "jobs", arg: null };
  }
  if (m.canonical && location.hash !== m.canonical) history.replaceState(null, "", m.canonical);
  if (app.view && app.view.name === m.view && app.view.arg === m.arg) return;
  leaveView();
  app.view = { name: m.view, arg: m.arg };
  for (const e of document.querySelectorAll("#dash [data-view]")) e.hidden = e.dataset.view !== m.view;
  for (const a of document.querySelectorAll("#nav [data-nav]")) {
    if (a.dataset.nav === VIEWS[m.view].nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.body.dataset.view = m.view;
  window.scrollTo(0, 0);
  VIEWS[m.view].enter(m.arg);
  refreshView().catch((e) => { $("global-error").textContent = String(e); });
}

function leaveView() {
  if (app.view) VIEWS[app.view.name].leave();
  app.view = null;
}

// refreshView reads what the view shown needs, and only that.
async function refreshView() {
  const v = app.view && VIEWS[app.view.name];
  if (v) await v.refresh();
}

// ---- one job ----

// newJob is the job view's state: its page of items is the one read with
// cursor, cursors holds the cursors of the pages before it (Previous pops
// one), next is the cursor of the page after it, null at the last.
function newJob(id) {
  return { id, found: false, notFound: false, done: false, eventsOpen: false, counts: "",
    state: "", cursor: "", cursors: [], next: null, itemsKey: "" };
}

// selectJob starts the job view of batch id, on the page of items it
// showed when it was left last, when it was this batch's (Back from an
// item returns to its page).
function selectJob(id) {
  const job = app.lastJob && app.lastJob.id === id ? app.lastJob : newJob(id);
  Object.assign(job, { found: false, notFound: false, eventsOpen: false, itemsKey: "" });
  app.job = job;
  const v = $("job");
  for (const a of ["data-done", "data-notfound", "data-page", "data-more", "data-followed"]) v.removeAttribute(a);
  $("job-msg").textContent = "";
  $("job-id").textContent = id;
  $("job-counts").textContent = "loading…";
  $("job-bar").replaceWith(el("div", { id: "job-bar", class: "bar big" }));
  $("state-filter").value = job.state;
  // Nothing to act on until the batch is read: it may be another key's.
  clearJobItems();
  setLive("polling");
  $("download").hidden = false;
  $("download").href = "/v1/batches/" + encodeURIComponent(id) + "/results";
  $("download").setAttribute("download", id + ".results.ndjson");
  renderJobs();
  openEvents(job);
}

function leaveJob() {
  closeEvents();
  if (app.itemsAbort) app.itemsAbort.abort();
  app.lastJob = app.job;
  app.job = null;
}

// openEvents follows the batch's Server-Sent Events where the server has
// them (progress, item and done events): each prompts a refresh, so the
// view changes as items end; polling goes on anyway. A stream that ends is
// reopened by EventSource from its last event ID; one that fails before
// it opened, of a batch this key reads, means the route is absent here (a
// stream of another key's batch fails as well, and says nothing of the
// route).
function openEvents(job) {
  if (app.missing.has("events") || typeof EventSource === "undefined" || app.events) return;
  const es = new EventSource("/v1/batches/" + encodeURIComponent(job.id) + "/events");
  let opened = false;
  const ours = () => app.job === job;
  const gone = () => {
    if (app.events === es) app.events = null;
    job.eventsOpen = false;
  };
  es.onopen = () => {
    opened = true;
    job.eventsOpen = true;
    if (!ours()) return;
    $("job").dataset.followed = "events";
    if (!job.done) setLive("events");
  };
  const poke = () => { if (ours()) refreshJobSoon(); };
  for (const type of ["message", "progress", "item"]) es.addEventListener(type, poke);
  es.addEventListener("done", () => { poke(); es.close(); gone(); });
  es.onerror = () => {
    if (es.readyState !== EventSource.CLOSED) return; // reconnecting by itself
    if (!opened && job.found) app.missing.add("events");
    gone();
  };
  app.events = es;
}

// setLive says how the job's view is kept current: "events" once its
// event stream opened, else "polling"; "done" for a batch that ended, and
// "gone" for one not found, which change no more: no label then.
function setLive(how) {
  $("job").dataset.live = how;
  $("job-live").textContent = how === "events" ? "live" : how === "polling" ? "polling" : "";
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
  const job = app.job;
  if (!job || job.notFound) return; // a batch not found is not asked for again
  const id = job.id;
  const r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "?limit=1");
  if (app.job !== job || job.notFound) return;
  if (r.status === 404) {
    notFound(job);
    return;
  }
  if (r.status !== 200) return;
  const b = r.body;
  job.found = true;
  job.done = !!b.done;
  sample(b, Date.now());
  if (app.batches.has(id)) {
    // Keep the job's row in step with its view.
    app.batches.set(id, Object.assign(app.batches.get(id), { counts: b.counts, done: b.done, done_at: b.done_at }));
    renderJobs();
  }
  $("job-bar").replaceWith(Object.assign(bar(b, true), { id: "job-bar" }));
  $("job-counts").textContent = countsText(b) + " · " + plural(b.total || 0, "item") + " · " +
    fmtRate(rate(b)) + " · ETA " + eta(b) + " · " + stateOf(b);
  $("job").setAttribute("data-done", String(job.done));
  $("cancel-btn").disabled = job.done;
  $("delete-btn").disabled = !job.done;
  const c = b.counts || {};
  $("retry-btn").disabled = !((c.failed || 0) + (c.canceled || 0)) || app.missing.has("retry");
  setLive(job.done ? "done" : job.eventsOpen ? "events" : "polling");
  if (!job.done) openEvents(job);
  // Reload the page of items when the filter, the page or the counts change.
  job.counts = JSON.stringify(c);
  const key = itemsKey(job);
  if (key !== job.itemsKey) {
    job.itemsKey = key;
    loadItems(job).catch((e) => { $("items-note").textContent = String(e); });
  }
}

// clearJobItems empties the job view's items and pager and disables its
// actions, until a read of the batch says what may be done.
function clearJobItems() {
  $("items").querySelector("tbody").replaceChildren();
  $("items-note").textContent = "";
  $("page-note").textContent = "";
  for (const b of ["cancel-btn", "retry-btn", "delete-btn", "prev-btn", "next-btn"]) $(b).disabled = true;
}

// notFound ends the view of a batch this key cannot read (expired, or
// another key's: a deep link): no more requests, nothing to act on.
function notFound(job) {
  job.notFound = true;
  closeEvents();
  forgetID(job.id);
  if (app.itemsAbort) app.itemsAbort.abort();
  $("job").dataset.notfound = "true";
  $("job-msg").textContent = "not found (or another key's)";
  $("job-counts").textContent = "";
  clearJobItems();
  $("download").hidden = true; // it would save the 404
  setLive("gone");
}

function itemsKey(job) {
  return job.state + "|" + job.cursor + "|" + job.counts;
}

// loadItems shows the job's page of items: from GET
// /v1/batches/{id}/items where the server has it, else the first
// MAX_ITEMS from the results stream, one NDJSON line per item.
async function loadItems(job) {
  if (app.itemsAbort) app.itemsAbort.abort();
  const ctl = new AbortController();
  app.itemsAbort = ctl;
  const id = job.id, state = job.state;
  if (!app.missing.has("items")) {
    const q = "?limit=" + PAGE_ITEMS + (state ? "&state=" + encodeURIComponent(state) : "") +
      (job.cursor ? "&cursor=" + encodeURIComponent(job.cursor) : "");
    let r;
    try {
      r = await api("GET", "/v1/batches/" + encodeURIComponent(id) + "/items" + q, { signal: ctl.signal });
    } catch (e) {
      if (e.name === "AbortError") return;
      job.itemsKey = ""; // the next poll reads this page again
      throw e;
    }
    if (app.job !== job || ctl.signal.aborted || job.notFound) return;
    if (r.status === 200 && r.body && Array.isArray(r.body.tasks)) {
      const rows = r.body.tasks.map((t) => ({ index: itemIndex(t.id), id: t.id, custom_id: t.custom_id,
        state: t.state, result: t.result, error: t.error }));
      job.next = r.body.next_cursor || null;
      renderItems(rows);
      renderPager(job, rows);
      return;
    }
    if (r.status === 404) {
      notFound(job);
      return;
    }
    if (!absent(r)) {
      // A busy server (429, 503) or a lost connection: the next poll
      // reads this page again, and the pager waits for it.
      job.itemsKey = "";
      $("items-note").textContent = "items: " + errText(r) + "; trying again";
      return;
    }
    app.missing.add("items");
  }
  await loadResults(id, state, ctl);
}

// renderPager says which page of items is shown, and enables Previous
// and Next as there are pages before and after it.
function renderPager(job, rows) {
  const page = job.cursors.length + 1;
  $("prev-btn").disabled = job.cursors.length === 0;
  $("next-btn").disabled = !job.next;
  let what = "no items";
  if (rows.length === 1) what = "item " + rows[0].index;
  if (rows.length > 1) what = "items " + rows[0].index + "–" + rows[rows.length - 1].index;
  if (!rows.length && job.next) what = "none in this stretch of the batch; Next looks further";
  $("page-note").textContent = "page " + page + " · " + what;
  $("items-note").textContent = plural(rows.length, (job.state ? job.state + " " : "") + "item") + " on this page";
  $("job").dataset.page = String(page);
  $("job").dataset.more = String(!!job.next);
}

// reloadItems reads the job's page of items again, after Next, Previous
// or a new filter; the pager waits for it.
function reloadItems(job) {
  $("prev-btn").disabled = true;
  $("next-btn").disabled = true;
  $("job").removeAttribute("data-page");
  job.itemsKey = itemsKey(job);
  loadItems(job).catch((e) => { $("items-note").textContent = String(e); });
}

function nextPage() {
  const job = app.job;
  if (!job || !job.next) return;
  job.cursors.push(job.cursor);
  job.cursor = job.next;
  job.next = null;
  reloadItems(job);
}

function prevPage() {
  const job = app.job;
  if (!job || !job.cursors.length) return;
  job.cursor = job.cursors.pop();
  job.next = null;
  reloadItems(job);
}

function filterItems() {
  const job = app.job;
  if (!job) return;
  job.state = $("state-filter").value;
  job.cursor = "";
  job.cursors = [];
  job.next = null;
  reloadItems(job);
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
  if (!app.job || app.job.id !== id) return;
  renderItems(rows);
  $("items-note").textContent = more ? "showing the first " + rows.length + "; download for all" : plural(rows.length, "item");
  $("page-note").textContent = "";
}

function renderItems(rows) {
  const tb = $("items").querySelector("tbody");
  tb.replaceChildren();
  for (const it of rows) {
    tb.append(el("tr", { "data-state": it.state, "data-id": it.id },
      el("td", { text: String(it.index) }),
      el("td", { class: "mono" }, el("a", { href: itemHash(it.id), text: it.id, title: "draw this item" })),
      el("td", { class: "custom-id", text: it.custom_id ?? "" }),
      el("td", { class: "state " + it.state, text: it.state }),
      el("td", { class: it.error ? "mono error" : "mono", text: outcomeText(it) })));
  }
}

// ---- one item, drawn ----

function closeItem() {
  app.item = null;
  Draw.stop();
  $("drawing").replaceChildren();
}

// openItem reads a task (a batch item or a single task) and what it was
// asked to solve, and draws it.
async function openItem(id) {
  if (app.item && app.item.id === id) return;
  app.item = { id, task: null, req: null, noPuzzle: false, ended: false, busy: false };
  Draw.stop();
  $("item").dataset.id = id;
  $("item").removeAttribute("data-ready");
  $("item-id").textContent = id;
  $("item-cancel-btn").hidden = true;
  $("item-retry-btn").hidden = true;
  $("item-delete-btn").hidden = true;
  $("item-meta").textContent = "loading…";
  $("item-msg").textContent = "";
  $("item-json").textContent = "";
  $("drawing").replaceChildren();
  const batch = id.includes("-") ? id.slice(0, id.lastIndexOf("-")) : "";
  $("item-batch").textContent = batch ? "of batch " + short(batch) : "";
  $("item-batch").href = batch ? jobHash(batch) : "#/jobs";
  $("item-batch").hidden = !batch;
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
        t.attempts ? plural(t.attempts, "attempt") : "", t.cached ? "from the cache" : "",
        t.completed_at ? "ended " + fmtTime(t.completed_at) : ""].filter(Boolean).join(" · ");
      $("item-json").textContent = t.error ? JSON.stringify(t.error, null, 1) : JSON.stringify(t.result);
    } else if (!it.task) {
      $("item-meta").textContent = "the item could not be read (" + errText(tr) + "); trying again";
    }
  }
  $("item-cancel-btn").hidden = !it.task || it.ended;
  // A batch item that failed or was canceled runs again under its ID; a
  // single task runs again by being submitted again.
  $("item-retry-btn").hidden = !it.task || !it.task.batch_id || !["failed", "canceled"].includes(it.task.state);
  // A single task that has ended can be deleted; a batch item goes with
  // its batch.
  $("item-delete-btn").hidden = !it.task || !!it.task.batch_id || !it.ended;
  if (!redraw || !it.task) return;
  Draw.render($("drawing"), it.task, it.req);
  // Ready once drawn with its puzzle, or once no puzzle is to come.
  if (it.req || it.noPuzzle) $("item").dataset.ready = it.task.state;
}

// deleteItem deletes the open single task, which has ended, and goes back
// to the jobs.
async function deleteItem() {
  const it = app.item;
  if (!it || !it.task || it.task.batch_id || !it.ended) return;
  if (!confirm("Delete task " + it.id + "? Its record and result are deleted for good.")) return;
  const r = await api("DELETE", "/v1/tasks/" + encodeURIComponent(it.id) + "?purge=true");
  if (app.item !== it) return;
  if (r.status !== 204) {
    $("item-msg").textContent = "delete: " + errText(r);
    return;
  }
  app.tasks = app.tasks.filter((t) => t.id !== it.id);
  renderTasks();
  location.hash = "#/jobs";
}

// retryItem runs the open batch item again, failed or canceled, under
// its ID; the view then follows it to its new end.
async function retryItem() {
  const it = app.item;
  if (!it || !it.task || !it.ended) return;
  const r = await api("POST", "/v1/tasks/" + encodeURIComponent(it.id) + "/retry");
  if (app.item !== it) return;
  $("item-msg").textContent = r.status === 200 ? "queued again" : "retry: " + errText(r);
  if (r.status !== 200) return;
  it.ended = false; // read its new end
  refreshItem();
}

// ---- search ----

// An item's ID is "<batch id>-<index>"; a single task's, and a batch's,
// 32 hex digits.
const ITEM_ID = /^[0-9a-f]{32}-(0|[1-9][0-9]{0,8})$/;
const TASK_ID = /^[0-9a-f]{32}$/;

// search opens what the search box names: an item or a single task by
// its ID, a batch by its ID, or, on a job's view, the job's item whose
// custom_id it is (GET /v1/batches/{id}/items?custom_id=).
async function search(ev) {
  ev.preventDefault();
  // A custom_id is matched exactly, spaces and case included; an ID is
  // read trimmed and in lower case.
  const typed = $("search").value;
  const raw = typed.trim();
  const msg = $("search-msg");
  msg.textContent = "";
  if (!raw) return;
  const lower = raw.toLowerCase();
  const job = app.job && !app.job.notFound ? app.job : null;
  // An answer that comes after the user went elsewhere opens nothing.
  const from = location.hash;
  const stale = () => location.hash !== from || app.job !== job;
  const isID = ITEM_ID.test(lower) || TASK_ID.test(lower);
  // On a job's view a custom_id shaped like an ID (an md5 sum, a UUID
  // without dashes) is looked up first; an ID is tried when none has it.
  if (job && isID) {
    const f = await findByCustomID(job, typed, raw);
    if (stale()) return;
    if (f.id) {
      location.hash = itemHash(f.id);
      return;
    }
  }
  if (ITEM_ID.test(lower)) {
    location.hash = itemHash(lower);
    return;
  }
  if (TASK_ID.test(lower)) {
    // A batch's ID has the same form as a single task's: a batch opens as
    // its job, anything else as a task (which says when there is none).
    const r = await api("GET", "/v1/batches/" + lower + "?limit=1");
    if (location.hash !== from) return;
    location.hash = r.status === 200 ? jobHash(lower) : itemHash(lower);
    return;
  }
  if (!job) {
    msg.textContent = "not an item or task ID; to find an item by its custom_id, open its job first";
    return;
  }
  msg.textContent = "searching…";
  const f = await findByCustomID(job, typed, raw);
  if (stale()) return;
  if (!f) {
    msg.textContent = "a custom_id has at most " + MAX_CUSTOM_ID + " bytes";
  } else if (f.id) {
    msg.textContent = "";
    location.hash = itemHash(f.id);
  } else if (f.answered) {
    msg.textContent = "no item of this job has the custom_id " + JSON.stringify(raw);
  } else {
    const r = f.r;
    msg.textContent = "search: " + errText(r) + (r.body && r.body.error && r.body.error.field ? " (" + r.body.error.field + ")" : "");
  }
}

// MAX_CUSTOM_ID is the most bytes a custom_id has (apitype.MaxCustomIDBytes).
const MAX_CUSTOM_ID = 64;

// findByCustomID asks job's items for the one whose custom_id is what
// the search box holds: as typed first (a custom_id may begin or end
// with spaces), then trimmed (raw), each when it can be a custom_id at
// all. It answers {answered, id, r}: id null when the server answered
// that none has it, answered false (and r the answer) when it did not
// answer the list; null when neither spelling fits a custom_id. A page
// of the search reads a bounded part of a large job and may end empty
// with a cursor, so it follows the cursors to the list's end, for as
// long as the job stays open.
async function findByCustomID(job, typed, raw) {
  let f = null;
  for (const cid of typed === raw ? [raw] : [typed, raw]) {
    if (new TextEncoder().encode(cid).length > MAX_CUSTOM_ID) continue;
    let cursor = "";
    for (;;) {
      const r = await api("GET", "/v1/batches/" + encodeURIComponent(job.id) + "/items?limit=1&custom_id=" + encodeURIComponent(cid) + cursor);
      const answered = r.status === 200 && !!r.body && Array.isArray(r.body.tasks);
      f = { answered, id: answered && r.body.tasks.length ? r.body.tasks[0].id : null, r };
      if (!answered || f.id || !r.body.next_cursor || app.job !== job) break;
      cursor = "&cursor=" + encodeURIComponent(r.body.next_cursor);
    }
    if (!f.answered || f.id) break;
  }
  return f;
}

// ---- actions ----

async function cancelJob() {
  const job = app.job;
  if (!job || job.notFound) return;
  if (!confirm("Cancel job " + job.id + "? Its pending and running items end as canceled; completed ones stay.")) return;
  const r = await api("DELETE", "/v1/batches/" + encodeURIComponent(job.id));
  if (app.job !== job) return;
  $("job-msg").textContent = r.status === 200 ? "canceled " + plural(r.body.canceled, "item") : "cancel: " + errText(r);
  if (r.status === 404) notFound(job);
  refreshJob();
}

// deleteJob deletes the open job, which has ended, with its results, and
// goes back to the jobs.
async function deleteJob() {
  const job = app.job;
  if (!job || job.notFound || !job.done) return;
  if (!confirm("Delete job " + job.id + "? Its items and results are deleted for good.")) return;
  const r = await api("DELETE", "/v1/batches/" + encodeURIComponent(job.id) + "?purge=true");
  if (app.job !== job) return;
  if (r.status !== 204) {
    $("job-msg").textContent = "delete: " + errText(r);
    if (r.status === 404) notFound(job);
    return;
  }
  forgetID(job.id);
  app.batches.delete(job.id);
  app.samples.delete(job.id);
  renderJobs();
  location.hash = "#/jobs";
}

// cancelItem cancels the open item or single task: pending, it never
// runs; running, it stops within milliseconds.
async function cancelItem() {
  const it = app.item;
  if (!it || it.ended) return;
  if (!confirm("Cancel " + it.id + "? If it has not ended, it ends as canceled.")) return;
  const r = await api("DELETE", "/v1/tasks/" + encodeURIComponent(it.id));
  if (app.item !== it) return;
  $("item-msg").textContent = r.status === 200 ? "canceled" : r.status === 409 ? "it had already ended" : "cancel: " + errText(r);
  it.ended = false; // read its end
  refreshItem();
}

// retryJob runs the job's failed and canceled items again.
async function retryJob() {
  const job = app.job;
  if (!job || job.notFound) return;
  const r = await api("POST", "/v1/batches/" + encodeURIComponent(job.id) + "/retry");
  if (app.job !== job) return;
  if (absent(r)) {
    app.missing.add("retry");
    $("job-msg").textContent = "this server cannot retry items";
    $("retry-btn").disabled = true;
    return;
  }
  if (r.status >= 200 && r.status < 300) {
    const n = r.body && r.body.retried;
    $("job-msg").textContent = "retrying " + (n !== undefined ? plural(n, "item") + " " : "") + "(failed and canceled)";
  } else {
    $("job-msg").textContent = "retry: " + errText(r);
    if (r.status === 404) notFound(job);
  }
  app.samples.delete(job.id);
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
      msg.textContent = "submitted " + plural(r.body.total, "item") + " as " + r.body.id;
      msg.setAttribute("data-id", r.body.id);
      $("ndjson").value = ""; // submitted: a second click must not submit it again
      rememberID(r.body.id);
      location.hash = jobHash(r.body.id);
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
  $("item-cancel-btn").addEventListener("click", cancelItem);
  $("item-retry-btn").addEventListener("click", retryItem);
  $("item-delete-btn").addEventListener("click", deleteItem);
  $("retry-btn").addEventListener("click", retryJob);
  $("delete-btn").addEventListener("click", deleteJob);
  $("prev-btn").addEventListener("click", prevPage);
  $("next-btn").addEventListener("click", nextPage);
  $("state-filter").addEventListener("change", filterItems);
  $("search-form").addEventListener("submit", search);
  window.addEventListener("hashchange", route);
  loadSession();
});
