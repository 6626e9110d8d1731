// spoold's customer portal: one tenant's webhook endpoints, its delivery
// log and the event catalogue, through the /v1 API with the session token
// of the link it was opened from (docs/contract.md §4, "The portal").
// The token arrives in the link's fragment, is kept in this tab's session
// storage and leaves the address bar at once. Every value from the server
// is written with textContent, never as HTML.
"use strict";

const TOKEN_STORE = "spoold.portal.token";
const main = document.getElementById("main");
const statusLine = document.getElementById("status");
let session = null; // GET /v1/portal/session
let catalogue = []; // GET /v1/event-types
let newSecret = null; // {name, secret}: a new endpoint's, shown once

// ---- the token and the API -------------------------------------------------

(function takeToken() {
  const hash = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = hash.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_STORE, token);
    history.replaceState(null, "", `${location.pathname}#/`);
  }
})();

class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

async function api(method, path, { body, contentType } = {}) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_STORE);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (contentType) headers["Content-Type"] = contentType;
  const r = await fetch(path, { method, headers, body, credentials: "omit" });
  if (!r.ok) {
    let answer = {};
    try { answer = await r.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, answer.kind || "error", answer.message || `HTTP ${r.status}`);
  }
  return r.status === 204 ? null : r.json();
}

const enc = encodeURIComponent;
const sendJson = (method, path, value, type = "application/json") =>
  api(method, path, { body: JSON.stringify(value), contentType: type });

// ---- DOM helpers -------------------------------------------------------------


function table(headers, rows) {
  return el("div", { class: "scroll" }, el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)));
}

function say(text, isError = false) {
  statusLine.textContent = text;
  statusLine.className = isError ? "error" : "";
}

function fail(e) {
  if (e instanceof ApiError && e.status === 401) return expired();
  say(`${e.kind ? e.kind + ": " : ""}${e.message}`, true);
}

function expired() {
  sessionStorage.removeItem(TOKEN_STORE);
  main.replaceChildren(el("section", { id: "expired" },
    el("h1", {}, "This link has expired or is not valid"),
    el("p", {}, "Ask for a new link where you found this one.")));
}

const when = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "Z") : "–");
const may = (verb) => Boolean(session && session.may.includes(verb));

// The name a new endpoint gets: the session's first pattern with a short
// random part in place of its `*`.
function newName() {
  const pattern = (session.queues && session.queues[0]) || `${session.tenant.replace(/[^A-Za-z0-9_-]/g, "_")}-*`;
  const random = Array.from(crypto.getRandomValues(new Uint8Array(4)), (b) => b.toString(16).padStart(2, "0")).join("");
  return pattern.includes("*") ? pattern.replace("*", random) : `${pattern}-${random}`;
}

// ---- endpoints ---------------------------------------------------------------

async function endpoints() {
  const all = [];
  let after = null;
  do {
    const q = new URLSearchParams({ limit: "200" });
    if (after) q.set("after", after);
    const page = await api("GET", `/v1/queues?${q}`);
    all.push(...page.queues);
    after = page.next;
  } while (after);
  const failed = new Map(all.filter((q) => q.name.endsWith(".failed"))
    .map((q) => [q.name.slice(0, -".failed".length), q.stats.visible]));
  return all.filter((q) => !q.name.endsWith(".failed"))
    .map((q) => ({ ...q, failedCount: failed.get(q.name) || 0 }));
}

function stateOf(q) {
  if (q.stats.paused) return el("span", { class: "pill paused" }, "paused");
  if (q.stats.breakerOpen) return el("span", { class: "pill failed" }, "failing");
  return el("span", { class: "pill active" }, "active");
}

function typeChoices(chosen = []) {
  const boxes = catalogue.map((t) => el("label", {},
    el("input", { type: "checkbox", name: "type", value: t.name, checked: chosen.includes(t.name) }), t.name));
  const others = chosen.filter((p) => !catalogue.some((t) => t.name === p));
  return el("fieldset", {}, el("legend", {}, "Event types"), boxes,
    el("label", {}, "other patterns", el("input", { name: "patterns", value: others.join(" "), placeholder: "invoice.*", size: 18 })));
}

function chosenTypes(form) {
  const boxes = [...form.querySelectorAll("input[name=type]:checked")].map((b) => b.value);
  const typed = form.elements.patterns.value.split(/[\s,]+/).filter(Boolean);
  return [...boxes, ...typed];
}

async function listView() {
  const list = await endpoints();
  const rows = list.map((q) => el("tr", { class: "clickable", "data-endpoint": q.name,
    onclick: () => { location.hash = `#/endpoint/${enc(q.name)}`; } },
  el("td", {}, el("a", { href: `#/endpoint/${enc(q.name)}` }, q.name)),
  el("td", { class: "mono" }, q.settings.destination || ""),
  el("td", {}, (q.settings.events || []).join(", ")),
  el("td", {}, stateOf(q)),
  el("td", { class: "num" }, q.stats.visible + q.stats.delayed + q.stats.leased),
  el("td", { class: "num" }, q.failedCount)));
  const form = el("form", { id: "add-endpoint" },
    el("label", {}, "URL", el("input", { name: "url", type: "url", required: true, placeholder: "https://example.com/webhooks" })),
    typeChoices(),
    el("button", { type: "submit", class: "primary" }, "Add endpoint"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = newName();
    // Every endpoint signs from the start: its first secret is made here
    // and shown once.
    sendJson("PUT", `/v1/queues/${enc(name)}`, {
      destination: form.elements.url.value.trim(),
      events: chosenTypes(form),
    }).then(() => sendJson("POST", `/v1/queues/${enc(name)}/secret/rotate`, {}))
      .then((r) => {
        newSecret = { name, secret: r.secret };
        say(`endpoint ${name} added`);
        location.hash = `#/endpoint/${enc(name)}`;
      }).catch(fail);
  });
  main.replaceChildren(
    el("h1", {}, "Endpoints"),
    el("section", {}, list.length
      ? table(["endpoint", "URL", "event types", "state", "pending", "failed"], rows)
      : el("p", { class: "note empty" }, "No endpoints yet.")),
    may("manage") ? el("section", {}, el("h2", {}, "Add an endpoint"), form) : null);
}

// ---- one endpoint --------------------------------------------------------------

async function endpointView(name) {
  const q = await api("GET", `/v1/queues/${enc(name)}`);
  const path = `/v1/queues/${enc(name)}`;
  const act = (promise, said) => promise.then(() => { say(said); route(); }).catch(fail);

  const edit = el("form", { id: "edit-endpoint" },
    el("label", {}, "URL", el("input", { name: "url", type: "url", required: true, value: q.settings.destination || "" })),
    typeChoices(q.settings.events || []),
    el("button", { type: "submit", class: "primary" }, "Save"));
  edit.addEventListener("submit", (ev) => {
    ev.preventDefault();
    act(sendJson("PATCH", path, { destination: edit.elements.url.value.trim(), events: chosenTypes(edit) },
      "application/merge-patch+json"), "saved");
  });

  const secretBox = el("div", { id: "secret" });
  const shown = (secret) => secretBox.replaceChildren(el("p", {}, "The signing secret, shown this once:"),
    el("div", { class: "secret", "data-secret": "" }, secret));
  if (newSecret && newSecret.name === name) {
    shown(newSecret.secret);
    newSecret = null;
  }
  const actions = el("div", { class: "actions" },
    q.stats.paused
      ? el("button", { type: "button", "data-action": "resume", onclick: () => act(api("POST", `${path}/resume`), "resumed") }, "Resume")
      : el("button", { type: "button", "data-action": "pause", onclick: () => act(api("POST", `${path}/pause`), "paused") }, "Pause"),
    el("button", { type: "button", "data-action": "rotate", onclick: () => {
      sendJson("POST", `${path}/secret/rotate`, {}).then((r) => {
        shown(r.secret);
        if (r.previousExpiresAt) {
          secretBox.append(el("p", { class: "note" }, `The previous secret signs too until ${when(r.previousExpiresAt)}.`));
        }
      }).catch(fail);
    } }, "Rotate signing secret"),
    el("button", { type: "button", class: "danger", "data-action": "delete", onclick: () => {
      if (!confirm(`Delete ${name} and its pending deliveries?`)) return;
      api("DELETE", path).then(() => { say(`${name} deleted`); location.hash = "#/"; }).catch(fail);
    } }, "Delete"));

  const test = el("form", { id: "send-test" },
    el("label", {}, "event type", el("select", { name: "type" },
      catalogue.map((t) => el("option", { value: t.name }, t.name)))),
    el("button", { type: "submit" }, "Send test event"));
  test.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const type = catalogue.find((t) => t.name === test.elements.type.value);
    const body = { type: type ? type.name : "test", test: true, data: (type && type.example) ?? {} };
    sendJson("POST", `${path}/messages`, body)
      .then((r) => { say(`test event ${r.id} sent`); route(); }).catch(fail);
  });

  main.replaceChildren(
    el("h1", {}, name, " ", stateOf(q)),
    el("section", {}, el("h2", {}, "Settings"), may("manage") ? edit : el("p", { class: "mono" }, q.settings.destination)),
    may("manage") ? el("section", {}, actions, secretBox) : null,
    may("publish") && catalogue.length ? el("section", {}, el("h2", {}, "Test"), test) : null,
    el("section", { id: "log" }, el("h2", {}, "Deliveries"), await deliveryLog(name)));
}

async function deliveryLog(name, before = null) {
  const q = new URLSearchParams({ limit: "50" });
  if (before) q.set("before", before);
  const page = await api("GET", `/v1/queues/${enc(name)}/deliveries?${q}`);
  const detail = el("div", { id: "attempts" });
  const rows = page.deliveries.map((m) => {
    const resend = m.state === "delivered"
      ? () => api("POST", `/v1/queues/${enc(name)}/history/${enc(m.id)}/resend`).then((r) => say(`sent again as ${r.id}`))
      : m.state === "failed"
        ? () => api("POST", `/v1/queues/${enc(name)}/redrive?${new URLSearchParams({ id: m.id })}`).then(() => say(`${m.id} sent again`))
        : null;
    return el("tr", { class: "clickable", "data-id": m.id, "data-state": m.state, onclick: () => showAttempts(m, detail) },
      el("td", { class: "mono" }, when(m.enqueuedAt)),
      el("td", {}, el("span", { class: `pill ${m.state}` }, m.state)),
      el("td", {}, m.eventType || ""),
      el("td", { class: "num" }, (m.attempts || []).length),
      el("td", {}, m.lastStatus ?? "–"),
      el("td", {}, resend && may("manage")
        ? el("button", { type: "button", "data-action": "resend", onclick: (ev) => {
          ev.stopPropagation();
          resend().then(route).catch(fail);
        } }, "Resend")
        : ""));
  });
  const recover = el("form", { id: "recover" },
    el("label", {}, "failed since (UTC)", el("input", { name: "since", type: "datetime-local", required: true })),
    el("button", { type: "submit" }, "Recover failures"));
  recover.addEventListener("submit", (ev) => {
    ev.preventDefault();
    // Every time on the page is UTC: the one typed here too.
    const since = new Date(`${recover.elements.since.value}Z`).toISOString();
    api("POST", `/v1/queues/${enc(name)}/redrive?${new URLSearchParams({ since })}`)
      .then((r) => { say(`${r.moved} failed deliveries sent again`); route(); }).catch(fail);
  });
  const older = page.next
    ? el("button", { type: "button", onclick: async () => {
      document.getElementById("log").replaceChildren(el("h2", {}, "Deliveries"), await deliveryLog(name, page.next));
    } }, "Older")
    : null;
  return el("div", {},
    page.deliveries.length
      ? table(["sent", "state", "event type", "attempts", "response", ""], rows)
      : el("p", { class: "note empty" }, "No deliveries yet."),
    older, detail, may("manage") ? recover : null);
}

function showAttempts(m, into) {
  const rows = (m.attempts || []).map((a) => el("tr", {},
    el("td", { class: "mono" }, when(a.at)),
    el("td", {}, a.status ?? a.error ?? "–"),
    el("td", { class: "num" }, Math.round((a.durationSeconds || 0) * 1000)),
    el("td", { class: "mono" }, a.response || "")));
  into.replaceChildren(el("h2", {}, `Attempts of ${m.id}`),
    rows.length ? table(["at", "response", "ms", "body"], rows) : el("p", { class: "note" }, "Not tried yet."),
    el("pre", {}, m.body ?? ""));
}

// ---- the catalogue -------------------------------------------------------------

function catalogueView() {
  main.replaceChildren(el("h1", {}, "Event types"),
    ...(catalogue.length
      ? catalogue.map((t) => el("section", { "data-type": t.name },
        el("h2", {}, t.name),
        el("p", {}, t.description || ""),
        t.example !== undefined ? el("div", {}, el("p", { class: "note" }, "Example"), el("pre", {}, JSON.stringify(t.example, null, 2))) : null,
        t.schema !== undefined ? el("details", {}, el("summary", {}, "Schema"), el("pre", {}, JSON.stringify(t.schema, null, 2))) : null))
      : [el("p", { class: "note" }, "No event types are described yet.")]));
}

// ---- routing -------------------------------------------------------------------

async function route() {
  if (!sessionStorage.getItem(TOKEN_STORE)) return expired();
  try {
    if (!session) {
      session = await api("GET", "/v1/portal/session");
      document.getElementById("tenant").textContent = session.tenant || "";
    }
    catalogue = (await api("GET", "/v1/event-types")).eventTypes;
    const [, view, arg] = (location.hash || "#/").split("/");
    if (view === "endpoint" && arg) await endpointView(decodeURIComponent(arg));
    else if (view === "event-types") catalogueView();
    else await listView();
  } catch (e) {
    fail(e);
  }
}

window.addEventListener("hashchange", route);
route();
