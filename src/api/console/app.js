// spoold's web console: a small client of the /v1 API (docs/contract.md §4).
// Every value from the server is written with textContent, never as HTML.
"use strict";

const KEY_STORE = "spoold.apiKey";
const PAGE = 50;
const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const logout = document.getElementById("logout");
let stopTail = null; // aborts a running tail when the view changes
let previous = new Map(); // queue -> {at, sent, acked}: for rates

// ---- the API -------------------------------------------------------------

class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

async function api(method, path, { signal, body, contentType } = {}) {
  const headers = {};
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers["Spooler-Api-Key"] = key;
  if (contentType) headers["Content-Type"] = contentType;
  const r = await fetch(path, { method, headers, signal, body });
  if (r.status === 401) {
    showLogin(key ? "That key was refused." : null);
    throw new ApiError(401, "unauthorized", "unauthorized");
  }
  if (!r.ok) {
    let body = {};
    try { body = await r.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, body.kind || "error", body.message || `HTTP ${r.status}`);
  }
  return r;
}

async function json(method, path, options) {
  const r = await api(method, path, options);
  return r.status === 204 ? null : r.json();
}

const enc = encodeURIComponent;
const baseOf = (q) => (q.endsWith(".failed") ? q.slice(0, -".failed".length) : q);
const isFailed = (q) => q.endsWith(".failed");

// ---- small DOM helpers ---------------------------------------------------


function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) =>
      el("th", { class: h.num ? "num" : "" }, h.label || h)))),
    el("tbody", {}, rows));
}

function say(text, isError = false) {
  statusLine.textContent = text;
  statusLine.className = isError ? "error" : "";
}

function ago(seconds) {
  if (!seconds) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

// Times in UTC, saying so: operators compare them with logs and alerts.
function when(rfc3339) {
  if (!rfc3339) return "–";
  return new Date(rfc3339).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

// A time typed into a `datetime-local` field, read as UTC (as every time
// the console shows is), in RFC 3339.
function utcInput(value) {
  return new Date(`${value}Z`).toISOString();
}

// A table in a box that scrolls sideways on a narrow screen: no column is
// ever hidden.
function scroller(child) {
  return el("div", { class: "scroll" }, child);
}

function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...parts.filter((p) => p).map((p) => el("span", {}, "/ ", p)));
}

// A hidden tab does not refresh itself.
const paused = () => document.visibilityState === "hidden";

function render(...children) {
  main.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

// ---- sign-in -------------------------------------------------------------

function showLogin(message) {
  logout.hidden = true;
  const form = document.getElementById("login").content.firstElementChild.cloneNode(true);
  const error = form.querySelector(".error");
  if (message) {
    error.textContent = message;
    error.hidden = false;
  }
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY_STORE, form.key.value);
    route();
  });
  crumbs();
  render(form);
  form.key.focus();
}

logout.addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORE);
  showLogin("Signed out.");
});

// ---- queues --------------------------------------------------------------

function stateOf(stats) {
  const pills = [];
  if (stats.paused) {
    pills.push(el("span", { class: "pill warn", title: "paused by an operator" }, "paused"));
  }
  if (stats.breakerOpen) {
    pills.push(el("span", { class: "pill bad", title: "circuit breaker open: the destination kept failing" },
      `breaker open · next probe ${when(stats.nextProbeAt)}`));
  }
  if (!pills.length) pills.push(el("span", { class: "pill ok" }, "running"));
  if (stats.unsigned) {
    pills.push(el("span", { class: "pill warn", title: "no signing secret: deliveries carry no webhook-signature" }, "unsigned"));
  }
  if (stats.previousSecretExpiresAt) {
    pills.push(el("span", { class: "pill", title: "a rotated-out secret signs beside the new one until then" },
      `${stats.signingSecrets} secrets sign · old one until ${when(stats.previousSecretExpiresAt)}`));
  }
  return pills;
}

async function pauseOrResume(queue, paused) {
  await json("POST", `/v1/queues/${enc(queue)}/${paused ? "resume" : "pause"}`);
  say(`${queue} ${paused ? "resumed" : "paused"}`);
  route();
}

async function breaker(queue, action) {
  await json("POST", `/v1/queues/${enc(queue)}/breaker/${action}`);
  say(action === "probe" ? `${queue}: probing now` : `${queue}: breaker closed`);
  route();
}

// A JSON merge patch (RFC 7396) of the settings: what it leaves out stays.
function settingsForm(queue, settings) {
  const text = el("textarea", { name: "patch", rows: 3, cols: 60, spellcheck: "false",
    placeholder: '{"breakerFailures": 1000, "backoff": {"maxSeconds": 60}}' });
  const form = el("form", { class: "toolbar settings" },
    el("label", {}, "Change settings (JSON merge patch; null resets)", text),
    el("button", { type: "submit" }, "Apply"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    json("PATCH", `/v1/queues/${enc(queue)}`, { body: text.value, contentType: "application/merge-patch+json" })
      .then((q) => { say(q.warnings?.length ? q.warnings.join(" ") : `${queue}: settings changed`, Boolean(q.warnings?.length)); route(); })
      .catch(fail);
  });
  const shown = el("details", {}, el("summary", {}, "All settings, as JSON"),
    el("pre", { class: "mono" }, JSON.stringify(settings, null, 2)), form);
  return shown;
}

// ---- rates ---------------------------------------------------------------

let rateRange = "seconds"; // or "minutes": the last 5 minutes or the hour

// A chart of `body` (an answer of a rates route) with its range switch.
function ratePanel(body) {
  const holder = el("div", { class: "chart-box" });
  const draw = () => holder.replaceChildren(rateChart(body, rateRange), rateLegend(body, rateRange));
  const button = (range, label) => el("button", {
    type: "button", "data-range": range, class: range === rateRange ? "primary" : "",
    onclick: (ev) => {
      rateRange = range;
      for (const b of ev.currentTarget.parentNode.children) b.className = b.dataset.range === range ? "primary" : "";
      draw();
    },
  }, label);
  draw();
  return el("section", { class: "rates" },
    el("div", { class: "toolbar" }, button("seconds", "5 minutes, by second"), button("minutes", "1 hour, by minute")),
    holder,
    body.pooled ? el("p", { class: "note" }, "Past the first 1 000 busy queues: the sum of all such queues.") : null);
}

// ---- settings ------------------------------------------------------------

// The settings an operator changes most, as fields; a save sends a merge
// patch of what changed (PATCH /v1/queues/{q}).
const FIELDS = [
  ["destination", "destination", "text", true],
  ["maxRetries", "max retries", "number", false],
  ["concurrency", "concurrency", "number", true],
  ["rateLimit", "rate limit (/s)", "number", true],
  ["timeoutSeconds", "timeout (s)", "number", true],
  ["breakerFailures", "breaker after failures", "number", true],
  ["backoff.initialSeconds", "backoff: first (s)", "number", true],
  ["backoff.maxSeconds", "backoff: longest (s)", "number", true],
  ["leaseTimeoutSeconds", "lease (s)", "number", false],
  ["retentionSeconds", "retention (s)", "number", false],
  ["historyRetentionSeconds", "history kept (s)", "number", false],
];

function pathGet(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

function settingsEditor(queue, info) {
  const settings = info.settings;
  const push = Boolean(settings.destination);
  const fields = FIELDS.filter(([, , , pushOnly]) => push || !pushOnly);
  const form = el("form", { class: "toolbar settings-fields" },
    fields.map(([path, label, type]) => {
      const value = pathGet(settings, path);
      return el("label", {}, label, el("input", {
        name: path, type, step: type === "number" ? "any" : undefined,
        value: value ?? "", placeholder: value == null ? "none" : undefined, size: type === "text" ? 36 : 8,
        disabled: info.managedByConfig,
      }));
    }),
    el("button", { type: "submit", class: "primary", disabled: info.managedByConfig }, "Save changes"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const patch = {};
    for (const [path, , type] of fields) {
      const raw = form.elements[path].value.trim();
      const before = pathGet(settings, path);
      const value = raw === "" ? null : type === "number" ? Number(raw) : raw;
      if (value === (before ?? null)) continue;
      const keys = path.split(".");
      let at = patch;
      for (const k of keys.slice(0, -1)) at = at[k] = at[k] || {};
      at[keys.at(-1)] = value;
    }
    if (!Object.keys(patch).length) {
      say("nothing changed");
      return;
    }
    json("PATCH", `/v1/queues/${enc(queue)}`, { body: JSON.stringify(patch), contentType: "application/merge-patch+json" })
      .then((q) => { say(q.warnings?.length ? q.warnings.join(" ") : `${queue}: settings changed`, Boolean(q.warnings?.length)); route(); })
      .catch(fail);
  });
  return el("section", { class: "settings-panel" },
    el("h2", {}, "Settings"),
    info.managedByConfig
      ? el("p", { class: "note" }, "Defined in the config file: change it there (then SIGHUP or restart).")
      : null,
    form,
    settingsForm(queue, settings));
}

// The dashboard's list: a page at a time in name order, under a name
// prefix typed into its filter box. `after` holds each shown page's cursor.
const QUEUE_PAGE = 100;
const listing = { prefix: "", after: [null] };

function filterBox() {
  const input = el("input", { type: "search", name: "prefix", value: listing.prefix,
    placeholder: "queues starting with…", "aria-label": "filter queues by name prefix" });
  return el("form", { class: "filter", onsubmit: (ev) => {
    ev.preventDefault();
    listing.prefix = input.value.trim();
    listing.after = [null];
    route();
  } }, input, el("button", { type: "submit" }, "Filter"));
}

function pager(next) {
  const back = listing.after.length > 1
    ? el("button", { type: "button", onclick: () => { listing.after.pop(); route(); } }, "← Previous")
    : null;
  const on = next
    ? el("button", { type: "button", onclick: () => { listing.after.push(next); route(); } }, "Next →")
    : null;
  return back || on ? el("p", { class: "pager" }, back, " ", on) : null;
}

async function queuesView() {
  crumbs();
  const gen = routeGen;
  const query = new URLSearchParams({ limit: QUEUE_PAGE });
  if (listing.prefix) query.set("prefix", listing.prefix);
  const after = listing.after[listing.after.length - 1];
  if (after) query.set("after", after);
  // The rates of all queues are an operator's: a scoped key does without.
  const [{ queues, next }, rates] = await Promise.all([json("GET", `/v1/queues?${query}`),
    json("GET", "/v1/rates").catch((e) => { if (e.status === 403) return null; throw e; })]);
  // A later route (a pause's, or the user's) has rendered since: this
  // answer is older than what the page shows, and must not replace it.
  if (gen !== routeGen) return;
  // Each failure queue right under its queue.
  const order = (q) => `${baseOf(q.name)}\u0000${isFailed(q.name) ? 1 : 0}`;
  queues.sort((a, b) => (order(a) < order(b) ? -1 : order(a) > order(b) ? 1 : 0));
  const now = Date.now();
  const rows = queues.map((q) => {
    const st = q.stats;
    const last = previous.get(q.name);
    const rate = (a, b) => (last ? ((a - b) * 1000) / Math.max(1, now - last.at) : null);
    const sentRate = last ? rate(st.sentTotal, last.sent) : null;
    const ackedRate = last ? rate(st.ackedTotal, last.acked) : null;
    previous.set(q.name, { at: now, sent: st.sentTotal, acked: st.ackedTotal });
    const push = Boolean(q.settings.destination);
    const action = push
      ? el("button", {
        type: "button",
        onclick: (ev) => { ev.stopPropagation(); pauseOrResume(q.name, st.paused || st.breakerOpen); },
      }, st.paused || st.breakerOpen ? "Resume" : "Pause")
      : null;
    const nested = isFailed(q.name) && queues.some((o) => o.name === baseOf(q.name));
    return el("tr", { class: nested ? "clickable nested" : "clickable", "data-queue": q.name, onclick: () => { location.hash = `#/queue/${enc(q.name)}`; } },
      el("td", {}, nested ? "↳ " : null, el("a", { href: `#/queue/${enc(q.name)}` }, q.name)),
      el("td", {}, isFailed(q.name) ? "dead letters" : push ? "push" : "pull"),
      el("td", { class: "num" }, st.visible),
      el("td", { class: "num" }, st.leased),
      el("td", { class: "num" }, st.delayed),
      el("td", { class: "num" }, st.retrying),
      el("td", { class: "num" }, ago(st.oldestVisibleAgeSeconds)),
      el("td", { class: "num" }, sentRate === null ? "…" : sentRate.toFixed(1)),
      el("td", { class: "num" }, ackedRate === null ? "…" : ackedRate.toFixed(1)),
      el("td", {}, push || st.paused ? stateOf(st) : ""),
      el("td", { class: "events" }, subscriptionOf(q.settings)),
      el("td", {}, action));
  });
  render(
    el("h1", {}, "Dashboard"),
    rates ? el("h2", {}, "All queues: messages per second") : null,
    rates ? ratePanel(rates) : null,
    el("h2", {}, "Queues"),
    filterBox(),
    scroller(table(["queue", "type", { label: "visible", num: 1 }, { label: "leased", num: 1 },
      { label: "delayed", num: 1 }, { label: "retrying", num: 1 }, { label: "oldest", num: 1 },
      { label: "sent/s", num: 1 }, { label: "acked/s", num: 1 }, "state", "subscribes to", ""], rows)),
    pager(next),
    eventForm(),
    el("p", { class: "note" }, "Rates are measured between refreshes (every 5 s)."));
  clearTimeout(queuesView.timer);
  queuesView.timer = setTimeout(function refresh() {
    if (location.hash !== "" && location.hash !== "#/") return;
    // Not while an event is being written: the refresh would wipe it.
    if (main.querySelector("details.events[open]") || paused()) queuesView.timer = setTimeout(refresh, 5000);
    else route();
  }, 5000);
}

// ---- one queue -----------------------------------------------------------

// The dead-letter filter's terms (a failure queue's form only): what
// "redrive / delete all matching" act on.
function filterQuery(form) {
  const p = new URLSearchParams();
  if (!form || !form.elements.reason) return p;
  const v = (name) => form.elements[name].value.trim();
  if (v("reason")) p.append("reason", v("reason"));
  if (v("status")) p.append("status", v("status"));
  for (const t of ["since", "until"]) {
    if (v(t)) p.append(t, utcInput(v(t)));
  }
  return p;
}

const SEARCH = ["type", "tenant", "contains", "match"];

// Search terms on what messages carry (event type, tenant, the body): they
// narrow a listing, a page at a time; bulk actions do not take them.
function searchQuery(form) {
  const p = new URLSearchParams();
  if (!form) return p;
  for (const k of SEARCH) {
    const v = form.elements[k].value.trim();
    if (v) p.append(k, v);
  }
  return p;
}

function searchFields() {
  return [
    el("label", {}, "event type", el("input", { name: "type", placeholder: "invoice.paid", size: 14 })),
    el("label", {}, "tenant", el("input", { name: "tenant", placeholder: "cus_42", size: 10 })),
    el("label", {}, "body contains", el("input", { name: "contains", size: 12 })),
    el("label", {}, "JSON path = value", el("input", { name: "match", placeholder: "$.customer.id=42", size: 16 })),
  ];
}

// Keeps a form's values per view, so that paging and coming back keep them.
function rememberForm(form, store, key, rerun) {
  const saved = new URLSearchParams(store.get(key) || "");
  for (const [k, v] of saved) if (form.elements[k]) form.elements[k].value = v;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const raw = new URLSearchParams();
    for (const e of form.elements) if (e.name) raw.set(e.name, e.value);
    store.set(key, raw.toString());
    rerun().catch(fail);
  });
}

// Marks `row` as the one whose detail is shown.
function selectRow(row) {
  for (const r of row.parentNode.children) r.classList.remove("selected");
  row.classList.add("selected");
}

function eventOf(m) {
  if (!m.eventType) return "–";
  return m.tenant ? `${m.eventType} · ${m.tenant}` : m.eventType;
}

function describeFilter(params) {
  const terms = [...params.entries()].filter(([k]) => k !== "id").map(([k, v]) => `${k} ${v}`);
  return terms.length ? ` matching ${terms.join(", ")}` : "";
}

// What an operator can do to one message: retry a waiting one now, delete
// it, or move a dead letter back to its queue. Each asks first.
function messageActions(queue, m, after) {
  const msg = `/v1/queues/${enc(queue)}/messages/${enc(m.id)}`;
  const act = (label, cls, action, question, run, done) => el("button", {
    type: "button", class: cls, "data-action": action,
    onclick: (ev) => {
      ev.stopPropagation();
      if (!confirm(question)) return;
      run().then(() => { say(done); after(); }).catch(fail);
    },
  }, label);
  const buttons = [];
  if (m.state === "delayed" && !isFailed(queue)) {
    buttons.push(act("Retry now", "primary", "retry-now", `Make ${m.id} visible now (retry count ${m.retryCount} kept)?`,
      () => json("POST", `${msg}/retry`), `${m.id}: visible now`));
  }
  if (isFailed(queue)) {
    const base = baseOf(queue);
    buttons.push(act("Redrive", "primary", "redrive-one", `Move ${m.id} back to ${base}?`,
      () => json("POST", `/v1/queues/${enc(base)}/redrive?id=${enc(m.id)}`), `${m.id}: moved back to ${base}`));
  }
  if (m.state !== "leased" && m.state !== "delivered") {
    buttons.push(act("Delete", "danger", "delete-one", `Delete ${m.id} for good?`,
      () => json("DELETE", msg), `${m.id}: deleted`));
  }
  return buttons;
}

async function messageDetail(queue, id, into, { delivered = false, after = () => route() } = {}) {
  const base = `/v1/queues/${enc(queue)}/${delivered ? "history" : "messages"}/${enc(id)}`;
  const m = await json("GET", base);
  const attempts = (m.attempts || []).map((a, i) => el("tr", {},
    el("td", { class: "num" }, i + 1),
    el("td", { class: "time" }, when(a.at)),
    el("td", {}, a.status ? `HTTP ${a.status}` : "–"),
    el("td", {}, a.error || ""),
    el("td", { class: "num" }, `${a.durationSeconds.toFixed(3)} s`),
    el("td", { class: "mono" }, (a.response || "").slice(0, 200))));
  const facts = [
    ["id", m.id], ["state", m.state], ["retries", m.retryCount], ["enqueued", when(m.enqueuedAt)],
    ["visible", when(m.visibleAt)], ["content type", m.contentType || "–"],
  ];
  if (m.eventType) facts.push(["event type", m.eventType], ["event id", m.eventId], ["tenant", m.tenant || "–"]);
  if (m.deliveredAt) facts.push(["delivered", when(m.deliveredAt)]);
  if (m.resentFrom) facts.push(["resent from", m.resentFrom]);
  if (m.reason) facts.push(["reason", m.reason], ["last status", m.lastStatus ?? "–"],
    ["last error", m.lastError || "–"], ["failed", when(m.failedAt)], ["from", m.originQueue]);
  const resend = delivered
    ? el("div", { class: "toolbar" }, el("button", {
      type: "button", class: "primary", "data-action": "resend",
      onclick: () => {
        if (!confirm(`Send ${m.id} to ${queue} again, as a new delivery?`)) return;
        json("POST", `${base}/resend`)
          .then((r) => say(`resent as ${r.id}`))
          .catch(fail);
      },
    }, "Resend"))
    : null;
  const request = m.request
    ? [el("h2", {}, "Stored request"),
      el("pre", { class: "request" }, `${m.request.method} ${m.request.path}\n` +
        Object.entries(m.request.headers).map(([k, v]) => `${k}: ${v}`).join("\n"))]
    : [];
  const actions = delivered ? [] : messageActions(queue, m, after);
  into.closest(".split")?.classList.add("has-detail");
  const close = el("button", {
    type: "button", class: "close", "aria-label": "Close",
    onclick: () => { into.replaceChildren(); into.closest(".split")?.classList.remove("has-detail"); },
  }, "×");
  into.replaceChildren(el("div", { class: "detail", "data-message": m.id },
    close,
    el("table", {}, el("tbody", {}, facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))),
    resend,
    actions.length ? el("div", { class: "toolbar" }, actions) : null,
    el("h2", {}, `Attempts (${attempts.length})`),
    attempts.length
      ? table([{ label: "#", num: 1 }, "at", "status", "error", { label: "took", num: 1 }, "response (start)"], attempts)
      : el("p", { class: "note" }, "No delivery attempt recorded."),
    ...request,
    el("h2", {}, "Body"),
    el("pre", { class: "body" }, m.body ?? `(base64) ${m.bodyBase64}`)));
}

async function bulk(queue, action, params, count) {
  const base = baseOf(queue);
  const path = action === "redrive"
    ? `/v1/queues/${enc(base)}/redrive`
    : `/v1/queues/${enc(queue)}/messages`;
  const method = action === "redrive" ? "POST" : "DELETE";
  const verb = action === "redrive" ? `move back to ${base}` : "delete";
  let question;
  if (count === null) {
    const dry = new URLSearchParams(params);
    dry.set("dryRun", "true");
    const would = await json(method, `${path}?${dry}`);
    const n = action === "redrive" ? would.moved : would.purged;
    question = `${verb === "delete" ? "Delete" : "Move"} ${n} of ${would.matched} message(s)${describeFilter(params)}` +
      (action === "redrive" ? ` back to ${base}` : "") + "?";
  } else {
    question = `${verb === "delete" ? "Delete" : "Move"} the ${count} selected message(s)` +
      (action === "redrive" ? ` back to ${base}` : "") + "?";
  }
  if (!confirm(question)) {
    say("nothing changed");
    return;
  }
  const done = await json(method, `${path}?${params}`);
  const n = action === "redrive" ? done.moved : done.purged;
  say(`${action === "redrive" ? "moved" : "deleted"} ${n} of ${done.matched}` +
    (done.remaining ? `; ${done.remaining} more match` : ""));
}

async function queueView(queue, after) {
  const failed = isFailed(queue);
  const deadLetterFilter = failed ? [
    el("label", {}, "reason", el("select", { name: "reason" },
      el("option", { value: "" }, "any"),
      ...["retries_exhausted", "permanent_status", "expired"].map((r) => el("option", { value: r }, r)))),
    el("label", {}, "last status", el("input", { name: "status", placeholder: "500 or 5xx", size: 8 })),
    el("label", {}, "failed since (UTC)", el("input", { name: "since", type: "datetime-local" })),
    el("label", {}, "failed until (UTC)", el("input", { name: "until", type: "datetime-local" })),
  ] : [];
  const form = el("form", { class: "toolbar filters" }, ...deadLetterFilter, ...searchFields(),
    el("button", { type: "submit", class: "primary" }, failed ? "Filter" : "Search"));
  rememberForm(form, queueView.filters, queue, () => queueView(queue, null));
  const searched = searchQuery(form);
  const params = filterQuery(form);
  for (const [k, v] of searched) params.append(k, v);
  params.set("limit", String(PAGE));
  if (after) params.set("after", after);
  const [info, page, rates] = await Promise.all([
    json("GET", `/v1/queues/${enc(queue)}`),
    json("GET", `/v1/queues/${enc(queue)}/messages?${params}`),
    failed ? null : json("GET", `/v1/queues/${enc(queue)}/rates`),
  ]);
  const again = () => queueView(queue, after).catch(fail);
  crumbs(el("a", { href: `#/queue/${enc(queue)}` }, queue),
    el("a", { href: `#/tail/${enc(queue)}` }, "tail"),
    failed ? null : el("a", { href: `#/deliveries/${enc(queue)}` }, "deliveries"),
    info.settings.historyRetentionSeconds
      ? el("a", { href: `#/history/${enc(queue)}` }, "history")
      : null);
  const selected = new Set();
  const detail = el("div", { id: "detail" });
  const selectedButtons = [];
  const refreshButtons = () => selectedButtons.forEach((b) => {
    b.disabled = selected.size === 0;
    b.textContent = `${b.dataset.label} (${selected.size})`;
  });
  const rows = page.messages.map((m) => {
    const box = failed ? el("input", {
      type: "checkbox", "data-id": m.id,
      onclick: (ev) => ev.stopPropagation(),
      onchange: (ev) => { ev.target.checked ? selected.add(m.id) : selected.delete(m.id); refreshButtons(); },
    }) : null;
    const preview = (m.body ?? "(binary)").slice(0, 80);
    return el("tr", {
      class: "clickable", "data-id": m.id,
      onclick: (ev) => {
        selectRow(ev.currentTarget);
        messageDetail(queue, m.id, detail, { after: again }).catch(fail);
      },
    },
    failed ? el("td", {}, box) : null,
    el("td", { class: "mono" }, m.id),
    el("td", {}, m.state),
    el("td", { class: "num" }, m.retryCount),
    el("td", { class: "time" }, when(m.enqueuedAt)),
    failed ? el("td", {}, m.reason || "–") : null,
    failed ? el("td", {}, m.lastStatus ?? "–") : null,
    failed ? el("td", { class: "time" }, when(m.failedAt)) : null,
    el("td", {}, eventOf(m)),
    el("td", { class: "mono" }, preview),
    failed ? null : el("td", { class: "row-actions" }, m.state === "delayed" ? messageActions(queue, m, again) : null));
  });
  const headers = [
    ...(failed ? [""] : []), "id", "state", { label: "retries", num: 1 }, "enqueued",
    ...(failed ? ["reason", "last status", "failed"] : []), "event · tenant", "body",
    ...(failed ? [] : [""]),
  ];
  const actions = [];
  if (failed) {
    const filterOnly = filterQuery(form);
    const ids = () => {
      const p = new URLSearchParams();
      for (const id of selected) p.append("id", id);
      return p;
    };
    const after_ = () => queueView(queue, after).catch(fail);
    for (const [label, action, cls, pick] of [
      ["Redrive selected", "redrive", "primary", "selected"],
      ["Delete selected", "purge", "danger", "selected"],
      ["Redrive all matching", "redrive", "", "all"],
      ["Delete all matching", "purge", "", "all"],
    ]) {
      const b = el("button", { type: "button", class: cls, "data-action": `${action}-${pick}` }, label);
      b.dataset.label = label;
      b.addEventListener("click", () => {
        const run = pick === "selected"
          ? bulk(queue, action, ids(), selected.size)
          : bulk(queue, action, filterOnly, null);
        run.then(after_).catch(fail);
      });
      if (pick === "selected") selectedButtons.push(b);
      else if (searched.size) {
        // The bulk routes take the dead-letter filter only: with search
        // terms, "all matching" would act on more than the list shows.
        b.disabled = true;
        b.title = "Search terms narrow the list only: select the messages to act on.";
      }
      actions.push(b);
    }
  }
  const st = info.stats;
  const push = Boolean(info.settings.destination);
  const where = push
    ? el("p", { class: "destination" }, "delivers to ", el("code", {}, info.settings.destination))
    : null;
  const summary = el("p", { class: "note" },
    `${st.visible} visible, ${st.leased} leased, ${st.delayed} delayed` +
      (failed ? ". " : `, ${st.retrying} retrying. `),
    ...(push ? stateOf(st) : []));
  const pager = el("div", { class: "toolbar" },
    after ? el("button", { type: "button", onclick: () => queueView(queue, null).catch(fail) }, "First page") : null,
    page.next
      ? el("button", { type: "button", onclick: () => queueView(queue, page.next).catch(fail) }, "Next page")
      : null);
  render(
    el("h1", {}, queue),
    where,
    summary,
    push
      ? el("div", { class: "toolbar" },
        el("button", { type: "button", onclick: () => pauseOrResume(queue, st.paused || st.breakerOpen).catch(fail) },
          st.paused || st.breakerOpen ? "Resume" : "Pause"),
        st.breakerOpen
          ? el("button", { type: "button", "data-action": "probe", onclick: () => breaker(queue, "probe").catch(fail) }, "Probe now")
          : null,
        st.breakerOpen
          ? el("button", { type: "button", "data-action": "close-breaker", onclick: () => breaker(queue, "close").catch(fail) }, "Close breaker")
          : null)
      : null,
    // A failure queue's arrivals are its queue's "failed" line.
    failed ? null : ratePanel(rates),
    failed ? null : settingsEditor(queue, info),
    el("h2", {}, "Messages"),
    form,
    actions.length ? el("div", { class: "toolbar actions" }, actions) : null,
    el("div", { class: "split" },
      el("div", { class: "list" },
        page.messages.length
          ? scroller(table(headers, rows))
          : el("p", { class: "note empty" }, "No messages here" + (failed || searched.size ? " (with this filter)." : ".")),
        searched.size ? el("p", { class: "note", id: "scanned" }, `Looked at ${page.scanned} message(s) for this page.`) : null,
        pager),
      detail));
  refreshButtons();
}
queueView.filters = new Map();

// ---- delivery history ----------------------------------------------------

async function historyView(queue, before) {
  crumbs(el("a", { href: `#/queue/${enc(queue)}` }, queue), "history");
  const form = el("form", { class: "toolbar filters" },
    el("label", {}, "delivered since (UTC)", el("input", { name: "since", type: "datetime-local" })),
    el("label", {}, "delivered until (UTC)", el("input", { name: "until", type: "datetime-local" })),
    ...searchFields(),
    el("button", { type: "submit", class: "primary" }, "Search"));
  rememberForm(form, historyView.filters, queue, () => historyView(queue, null));
  const params = searchQuery(form);
  for (const t of ["since", "until"]) {
    const v = form.elements[t].value.trim();
    if (v) params.append(t, utcInput(v));
  }
  params.set("limit", String(PAGE));
  if (before) params.set("before", before);
  const page = await json("GET", `/v1/queues/${enc(queue)}/history?${params}`);
  const detail = el("div", { id: "detail" });
  const rows = page.messages.map((m) => {
    const last = (m.attempts || []).at(-1);
    return el("tr", {
      class: "clickable", "data-id": m.id,
      onclick: (ev) => {
        selectRow(ev.currentTarget);
        messageDetail(queue, m.id, detail, { delivered: true }).catch(fail);
      },
    },
    el("td", { class: "mono" }, m.id),
    el("td", { class: "time" }, when(m.deliveredAt)),
    el("td", {}, eventOf(m)),
    el("td", { class: "num" }, (m.attempts || []).length),
    el("td", {}, last?.status ?? "–"),
    el("td", {}, m.resentFrom || ""),
    el("td", { class: "mono" }, (m.body ?? "(binary)").slice(0, 80)));
  });
  const pager = el("div", { class: "toolbar" },
    before ? el("button", { type: "button", onclick: () => historyView(queue, null).catch(fail) }, "Newest") : null,
    page.next
      ? el("button", { type: "button", onclick: () => historyView(queue, page.next).catch(fail) }, "Older")
      : null);
  render(
    el("h1", {}, `${queue}: delivered`),
    el("p", { class: "note" }, "Delivered messages kept for the queue's history retention, newest first. " +
      "Resend sends one again as a new delivery (a new delivery id), saying which it repeats."),
    form,
    el("div", { class: "split" },
      el("div", { class: "list" },
        page.messages.length
          ? scroller(table(["id", "delivered", "event · tenant", { label: "attempts", num: 1 }, "last status", "resent from", "body"], rows))
          : el("p", { class: "note empty" }, "Nothing delivered here (with this filter)."),
        pager),
      detail));
}
historyView.filters = new Map();

// ---- delivery log ----------------------------------------------------------

// One list of what the queue sent: pending, retrying, failed (in
// q.failed) and delivered (its history), newest first.
async function deliveriesView(queue, before) {
  crumbs(el("a", { href: `#/queue/${enc(queue)}` }, queue), "deliveries");
  const form = el("form", { class: "toolbar filters" },
    el("label", {}, "sent since (UTC)", el("input", { name: "since", type: "datetime-local" })),
    el("label", {}, "sent until (UTC)", el("input", { name: "until", type: "datetime-local" })),
    ...searchFields(),
    el("button", { type: "submit", class: "primary" }, "Search"));
  rememberForm(form, deliveriesView.filters, queue, () => deliveriesView(queue, null));
  const params = searchQuery(form);
  for (const t of ["since", "until"]) {
    const v = form.elements[t].value.trim();
    if (v) params.append(t, utcInput(v));
  }
  params.set("limit", String(PAGE));
  if (before) params.set("before", before);
  const page = await json("GET", `/v1/queues/${enc(queue)}/deliveries?${params}`);
  const detail = el("div", { id: "detail" });
  const rows = page.deliveries.map((m) => el("tr", {
    class: "clickable", "data-id": m.id, "data-state": m.state,
    onclick: (ev) => {
      selectRow(ev.currentTarget);
      messageDetail(m.queue, m.id, detail, { delivered: m.state === "delivered" }).catch(fail);
    },
  },
  el("td", { class: "mono" }, m.id),
  el("td", {}, el("span", { class: `pill ${m.state}` }, m.state)),
  el("td", { class: "time" }, when(m.enqueuedAt)),
  el("td", {}, eventOf(m)),
  el("td", { class: "num" }, (m.attempts || []).length),
  el("td", {}, m.lastStatus ?? "–"),
  el("td", {}, m.reason || ""),
  el("td", { class: "mono" }, (m.body ?? "(binary)").slice(0, 80))));
  // Failures since a time go back into the queue: the redrive route.
  const redriveForm = el("form", { class: "toolbar", id: "redrive-since" },
    el("label", {}, "failed since (UTC)", el("input", { name: "since", type: "datetime-local", required: true })),
    el("button", { type: "submit" }, "Redrive failures"));
  redriveForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const since = utcInput(redriveForm.elements.since.value);
    bulk(`${queue}.failed`, "redrive", new URLSearchParams({ since }), null)
      .then(() => deliveriesView(queue, before)).catch(fail);
  });
  const pager = el("div", { class: "toolbar" },
    before ? el("button", { type: "button", onclick: () => deliveriesView(queue, null).catch(fail) }, "Newest") : null,
    page.next
      ? el("button", { type: "button", onclick: () => deliveriesView(queue, page.next).catch(fail) }, "Older")
      : null);
  render(
    el("h1", {}, `${queue}: deliveries`),
    el("p", { class: "note" }, "Everything the queue was sent, newest first: pending, retrying, failed " +
      "(in its failure queue) and delivered (while its history keeps them), with attempts and last status."),
    form,
    redriveForm,
    el("div", { class: "split" },
      el("div", { class: "list" },
        page.deliveries.length
          ? scroller(table(["id", "state", "sent", "event · tenant", { label: "attempts", num: 1 }, "last status", "reason", "body"], rows))
          : el("p", { class: "note empty" }, "Nothing here (with this filter)."),
        pager),
      detail));
}
deliveriesView.filters = new Map();

// ---- events --------------------------------------------------------------

// Publishes one event (POST /v1/events) and says where it went.
function eventForm() {
  const form = el("form", { class: "toolbar send-event" },
    el("label", {}, "event type", el("input", { name: "type", placeholder: "invoice.paid", required: true, size: 16 })),
    el("label", {}, "tenant", el("input", { name: "tenant", placeholder: "optional", size: 10 })),
    el("label", {}, "payload (JSON)", el("textarea", { name: "payload", rows: 2, cols: 40, spellcheck: "false" }, "{}")),
    el("button", { type: "submit", class: "primary" }, "Publish"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let payload;
    try {
      payload = JSON.parse(form.elements.payload.value);
    } catch (e) {
      say(`payload: not JSON (${e.message})`, true);
      return;
    }
    const event = { type: form.elements.type.value.trim(), payload };
    const tenant = form.elements.tenant.value.trim();
    if (tenant) event.tenant = tenant;
    json("POST", "/v1/events", { body: JSON.stringify(event), contentType: "application/json" })
      .then((r) => {
        const to = r.deliveries.map((d) => d.queue);
        const filtered = r.matchedByType - to.length;
        say(`event ${r.id}: ${to.length} deliver${to.length === 1 ? "y" : "ies"}${to.length ? " to " + to.join(", ") : " (no subscriber)"}` +
          (filtered > 0 ? `; ${filtered} kept out by content filters` : ""));
        route();
      })
      .catch(fail);
  });
  return el("details", { class: "events" }, el("summary", {}, "Publish an event"), form);
}

function subscriptionOf(settings) {
  if (!settings.events?.length) return "";
  return settings.events.join(", ") + (settings.tenant ? ` (tenant ${settings.tenant})` : "") +
    (settings.filter ? ` filtered by ${JSON.stringify(settings.filter)}` : "");
}

// ---- tail ----------------------------------------------------------------

async function tailView(queue) {
  crumbs(el("a", { href: `#/queue/${enc(queue)}` }, queue), "tail");
  const lines = el("tbody", {});
  const stop = new AbortController();
  stopTail = () => stop.abort();
  render(el("h1", {}, `${queue}: live`),
    el("p", { class: "note" }, "The 20 newest, then each message as it arrives."),
    el("div", { id: "tail-lines" }, el("table", {},
      el("thead", {}, el("tr", {}, ["id", "enqueued", "retries", "body"].map((h) => el("th", {}, h)))), lines)));
  const r = await api("GET", `/v1/queues/${enc(queue)}/tail?last=20`, { signal: stop.signal });
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = pending.indexOf("\n")) >= 0) {
        const m = JSON.parse(pending.slice(0, nl));
        pending = pending.slice(nl + 1);
        lines.prepend(el("tr", { "data-id": m.id },
          el("td", { class: "mono" }, m.id), el("td", { class: "time" }, when(m.enqueuedAt)),
          el("td", { class: "num" }, m.retryCount), el("td", { class: "mono" }, (m.body ?? "(binary)").slice(0, 120))));
      }
    }
    say("the server ended the tail");
  } catch (e) {
    if (e.name !== "AbortError") throw e;
  }
}

// ---- cluster -------------------------------------------------------------

async function clusterView() {
  crumbs("cluster");
  let c;
  try {
    c = await json("GET", "/v1/cluster");
  } catch (e) {
    if (e.status !== 404) throw e;
    render(el("h1", {}, "Cluster"), el("p", { class: "note", id: "single-node" }, "This spoold runs as a single node."));
    return;
  }
  const me = c.nodeId;
  const rows = c.members.map((m) => el("tr", { "data-node": m.nodeId },
    el("td", { class: "num" }, m.nodeId),
    el("td", { class: "mono" }, m.addr),
    el("td", {}, m.nodeId === c.primary?.nodeId ? "primary" : m.voter ? "follower" : "learner",
      m.nodeId === me ? " (this replica)" : ""),
    el("td", {}, m.voter ? "yes" : "no"),
    el("td", { class: "num" }, m.matchIndex ?? "–"),
    el("td", { class: "num" }, m.lagRecords ?? "–"),
    el("td", { class: "num" }, m.lastContactMs == null ? "–" : `${(m.lastContactMs / 1000).toFixed(1)} s ago`)));
  const facts = [
    ["this replica", `${me} (${c.role})`], ["term", c.term], ["primary", c.primary ? `${c.primary.nodeId} · ${c.primary.apiUrl || "no API URL"}` : "none"],
    ["commit index", c.commitIndex ?? "–"], ["applied index", c.appliedIndex ?? "–"],
    ["snapshot index", c.snapshotIndex ?? "–"], ["purged up to", c.purgedIndex ?? "–"],
  ];
  if (c.snapshot) {
    facts.push(["receiving a snapshot", c.snapshot.receiving ? `yes, ${c.snapshot.receivedBytes} bytes so far` : "no"],
      ["snapshots installed", c.snapshot.installed]);
  }
  render(
    el("h1", {}, "Cluster"),
    el("table", { class: "facts" }, el("tbody", {}, facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))),
    el("h2", {}, "Members"),
    scroller(table([{ label: "node", num: 1 }, "address", "role", "voter", { label: "match index", num: 1 },
      { label: "lag (records)", num: 1 }, { label: "last contact", num: 1 }], rows)),
    el("p", { class: "note" }, c.role === "primary"
      ? "Lag and last contact as this primary sees its followers."
      : "Lag and last contact are known on the primary; open its console for them."));
  clearTimeout(clusterView.timer);
  clusterView.timer = setTimeout(function refresh() {
    if (location.hash !== "#/cluster") return;
    if (paused()) clusterView.timer = setTimeout(refresh, 5000);
    else route();
  }, 5000);
}

// ---- routing -------------------------------------------------------------

function fail(e) {
  if (e instanceof ApiError && e.status === 401) return;
  say(`${e.kind ? e.kind + ": " : ""}${e.message}`, true);
}

// Counts routes: a view whose answers arrive after a later route began
// renders nothing (a refresh in flight when a queue was paused showed it
// running again).
let routeGen = 0;

async function route() {
  routeGen += 1;
  if (stopTail) { stopTail(); stopTail = null; }
  logout.hidden = !sessionStorage.getItem(KEY_STORE);
  const [, view, arg] = (location.hash || "#/").split("/");
  const name = arg ? decodeURIComponent(arg) : null;
  try {
    if (view === "queue" && name) await queueView(name, null);
    else if (view === "history" && name) await historyView(name, null);
    else if (view === "deliveries" && name) await deliveriesView(name, null);
    else if (view === "tail" && name) await tailView(name);
    else if (view === "cluster") await clusterView();
    else await queuesView();
  } catch (e) {
    fail(e);
  }
}

window.addEventListener("hashchange", route);
route();
