// The web inbox: plain DOM, no build step. Every answer goes to the same API as any client;
// the page keeps no token and no answer (a password field is cleared as it is sent).
"use strict";

// Every URL is made from where this script was served (`<base>/static/inbox.js`), so the page
// works behind a reverse proxy under a path prefix.
const BASE = new URL("../", document.currentScript.src).href;
const mode = document.body.dataset.mode;
const linkToken = mode === "link" ? location.pathname.split("/").pop() : null;
const EVENT_TYPES = ["request.created", "request.answered", "request.expired", "run.status",
  "request.reminder", "request.escalated", "request.overdue"];
const PAGES_MAX = 100;  // a list is followed through at most this many pages
let csrf = null;
let selected = null;  // the selected question's keyOf
let selectedIndex = 0;  // and its place in the list, for when it goes
let items = [];
let deepLinked = false;
let source = null;
let reconnectTimer = null;
let historyTimer = null;

const $ = (id) => document.getElementById(id);
// A question is its workspace and request id (copies of a workspace share ids).
const keyOf = (r) => `${encodeURIComponent(r.workspace)}|${encodeURIComponent(r.request_id)}`;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) node.append(c);
  return node;
}

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (csrf && method !== "GET") headers["X-CSRF-Token"] = csrf;
  const r = await fetch(BASE + path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let doc = {};
  try { doc = await r.json(); } catch (e) { /* an empty body */ }
  if (!r.ok) {
    // Any 401 of a signed-in page means the session ended: ask to log in again.
    if (r.status === 401 && !linkToken && path !== "v1/session") needLogin(doc.error);
    throw new ApiError(doc.error || `HTTP ${r.status}`, r.status);
  }
  return doc;
}

// A list endpoint, every page of it: `{"<key>": [...], "next": cursor|null}` (or no `next`).
// `next` is a cursor sent back as `?cursor=`, or a link (with a `?`), followed as it is.
async function listAll(path, key, params) {
  let out = [];
  let next = null;
  for (let page = 0; page < PAGES_MAX; page++) {
    const p = new URLSearchParams(params);
    if (next) p.set("cursor", next);
    const link = next && next.includes("?") ? next.replace(/^\//, "") : null;
    const doc = await api("GET", link || `${path}?${p}`);
    out = out.concat(doc[key] || []);
    next = doc.next;
    if (!next) break;
  }
  return out;
}

// -- login ------------------------------------------------------------------------------------
// The type filter lists the input types the API's document names (its `InputType` enum).
async function listTypes() {
  if ($("f-type")?.options.length > 1) return;  // listed at an earlier login
  try {
    const doc = await api("GET", "openapi.json");
    const types = doc.components?.schemas?.InputType?.enum || [];
    $("f-type")?.replaceChildren(el("option", { value: "" }, "all"),
      ...types.map((t) => el("option", {}, t)));
  } catch (e) { /* the filter offers "all" alone */ }
}

async function start() {
  if (mode === "link") return loadLink();
  keepBarHeight();
  try {
    // Not signed in is an answer, not an error: `{"signed_in": false}` (no failed login logged).
    const me = await api("GET", "v1/session");
    if (me.signed_in === false) {
      // `http.oidc` is set: people sign in through the provider; tokens stay for machines.
      if (me.sign_in_with) {
        $("sso-link").textContent = `Sign in with ${me.sign_in_with}`;
        $("sso").hidden = false;
      }
      showLogin(null);
    } else signedIn(me);
  } catch (e) {
    showLogin(null);
  }
}

// The sticky bar's height (it wraps onto two lines on a phone), kept in --bar-height: what is
// scrolled to (a deep link, j/k) lands below it, not under it.
function keepBarHeight() {
  const bar = document.querySelector(".bar");
  if (!bar) return;
  const keep = () => document.documentElement.style.setProperty("--bar-height", `${bar.offsetHeight}px`);
  keep();
  if (typeof ResizeObserver === "function") new ResizeObserver(keep).observe(bar);
}

function showLogin(why) {
  $("inbox").hidden = true;
  $("logout").hidden = true;
  $("live").hidden = true;
  $("login").hidden = false;
  $("login-why").hidden = !why;
  $("login-why").textContent = why || "";
  $("token").focus();
}

function needLogin(why) {
  if (!csrf && !$("login").hidden) return;  // already asking
  csrf = null;
  closeStream();
  showLogin(`${why || "Your session ended"}. Log in again to go on.`);
}

function signedIn(me) {
  csrf = me.csrf;
  $("who").textContent = `${me.name} · ${me.role}`;
  $("login").hidden = true;
  $("inbox").hidden = false;
  $("logout").hidden = false;
  $("live").hidden = false;
  refresh();
  loadHistory();
  follow();
  listTypes();
}

$("login-form")?.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const field = $("token");
  const token = field.value.trim();
  field.value = "";
  try {
    signedIn(await api("POST", "v1/session", { token }));
    $("login-error").textContent = "";
  } catch (e) {
    $("login-error").textContent = e.message;
  }
});

$("logout")?.addEventListener("click", async () => {
  await api("DELETE", "v1/session").catch(() => {});
  location.reload();
});

// -- the event stream: live, and back after a restart ---------------------------------------------
function setLive(text, state) {
  $("live").textContent = text;
  $("live").dataset.state = state;
}

function closeStream() {
  if (source) source.close();
  source = null;
  clearTimeout(reconnectTimer);
}

function follow() {
  closeStream();
  const s = new EventSource(BASE + "v1/events");
  source = s;
  let dropped = false;
  s.onopen = () => {
    setLive("live", "live");
    // What happened before the stream was open (between the first listing and now, or while
    // away) came as no event: list again.
    refresh();
    if (dropped) loadHistory();
  };
  s.onerror = () => {
    if (source !== s) return;
    dropped = true;
    setLive("reconnecting…", "away");
    // The browser retries a dropped stream by itself, but not one refused with an HTTP error
    // (a 401 after the token was revoked): find out which, then log in again or retry.
    if (s.readyState === EventSource.CLOSED) probe();
  };
  // Events after the browser's Last-Event-ID are gone (docs/inbox.md, `reset`): list again.
  s.addEventListener("reset", () => {
    refresh();
    loadHistory();
  });
  for (const type of EVENT_TYPES) {
    s.addEventListener(type, (msg) => {
      const e = JSON.parse(msg.data);
      activity(e);
      refresh();
      if (type === "request.answered" || type === "run.status") historySoon();
    });
  }
}

async function probe() {
  closeStream();
  try {
    const me = await api("GET", "v1/session");
    if (me.signed_in === false) needLogin("Your session ended");
    else follow();
  } catch (e) {
    if (e.status === 401) needLogin(e.message.replace(/[.;].*$/, ""));
    else reconnectTimer = setTimeout(probe, 2000);  // the daemon is not back yet
  }
}

// -- the list ------------------------------------------------------------------------------------
let listings = 0;
async function refresh() {
  const params = {};
  const ws = $("f-workspace").value.trim();
  const type = $("f-type").value;
  const sort = $("f-sort")?.value;
  const age = $("f-age")?.value;
  const due = $("f-due")?.value;
  if (ws) params.workspace = ws;
  if (type) params.input_type = type;
  if (age) params.older_than = age;
  if (due) params.due_within = due;
  if (sort && sort !== "newest") params.sort = sort;
  if ($("f-mine")?.checked) params.mine = "true";  // only the questions that name me
  const mine = ++listings;
  try {
    const got = await listAll("v1/requests", "requests", params);
    // Listings overlap when events come in bursts and may finish out of order: only the newest
    // one is shown, or an older answer would take away a question (and the card being typed in).
    if (mine !== listings) return;
    items = got;
    render();
  } catch (e) { /* a 401 asks to log in; anything else: the stream brings the next try */ }
}

// Text refreshes as it is typed; a select and the "Mine only" box on `change` (what every way
// of choosing fires, a script's included: `input` is not fired by all).
const chosen = (t) => t.tagName === "SELECT" || t.type === "checkbox";  // on `change`, like a select
$("filters")?.addEventListener("input", (ev) => { if (!chosen(ev.target)) refresh(); });
$("filters")?.addEventListener("change", (ev) => { if (chosen(ev.target)) refresh(); });
$("filters")?.addEventListener("submit", (ev) => { ev.preventDefault(); refresh(); });

// Questions grouped by workspace and run, groups in the order of their first question in the
// list's sort (newest first, waiting longest, or due soonest).
function groups(list) {
  const byKey = new Map();
  for (const r of list) {
    const k = `${r.workspace}\u0000${r.run_id || ""}`;
    if (!byKey.has(k)) byKey.set(k, []);
    byKey.get(k).push(r);
  }
  return [...byKey.values()];
}

// Cards are kept across refreshes (keyed by question): an answer being typed or an edit being
// made is never wiped by another question arriving.
const cards = new Map();
const sections = new Map();

function sameChildren(parent, nodes) {
  const now = parent.children;
  return now.length === nodes.length && nodes.every((n, i) => now[i] === n);
}

function render() {
  const box = $("requests");
  const live = new Set(items.map(keyOf));
  for (const k of [...cards.keys()]) if (!live.has(k)) cards.delete(k);
  for (const k of [...picked.keys()]) if (!live.has(k)) picked.delete(k);
  const shown = groups(items).map((list) => {
    const gk = `${list[0].workspace}\u0000${list[0].run_id || ""}`;
    const section = sections.get(gk) || groupView(list[0]);
    sections.set(gk, section);
    const nodes = [section.firstElementChild, ...list.map((r) => {
      if (!cards.has(keyOf(r))) cards.set(keyOf(r), card(r));
      return cards.get(keyOf(r));
    })];
    for (const r of list) showHanded(cards.get(keyOf(r)), r.delegations);
    for (const r of list) showApprovals(cards.get(keyOf(r)), r.approvals);
    for (const r of list) showFollowUp(cards.get(keyOf(r)), r);
    if (!sameChildren(section, nodes)) section.replaceChildren(...nodes);
    return section;
  });
  for (const [gk, section] of [...sections]) if (!shown.includes(section)) sections.delete(gk);
  if (!sameChildren(box, shown)) box.replaceChildren(...shown);
  if (!linkToken) showPicked();  // an answered question leaves the selection
  $("empty").hidden = items.length > 0;
  $("count").textContent = items.length ? `(${items.length})` : "";
  dueMarks();
  const linked = new URLSearchParams(location.hash.slice(1)).get("request");
  const hit = linked && items.find((r) => r.request_id === linked);
  if (hit && !deepLinked) {
    selected = keyOf(hit);  // a notification's deep link: that question, once
    deepLinked = true;
    reveal(selectedNode(), "start");
  }
  if (!items.some((r) => keyOf(r) === selected)) {
    // The selected question was answered (or expired): the one in its place is next, and
    // keyboard focus goes with it rather than falling back to the page.
    const nodes = [...document.querySelectorAll(".item")];
    const next = nodes[Math.min(selectedIndex, nodes.length - 1)];
    selected = next ? next.dataset.key : null;
    if (next && (document.activeElement === document.body || !document.activeElement)) {
      next.focus({ preventScroll: true });
    }
  }
  highlight();
}

function groupView(r) {
  const id = `g-${Math.abs(hash(keyOf(r)))}`;
  return el("section", { class: "group", "aria-labelledby": id },
    el("h3", { id, class: "group-title" },
      el("span", { class: "ws" }, r.workspace),
      el("span", { class: "run" }, r.run_id ? `run ${r.run_id}` : "", r.agent ? ` · ${r.agent}` : "")));
}

function hash(text) {
  let h = 0;
  for (const ch of text) h = (Math.imul(h, 31) + ch.codePointAt(0)) | 0;
  return h;
}

function selectedNode() {
  return selected ? document.querySelector(`.item[data-key="${CSS.escape(selected)}"]`) : null;
}

function highlight() {
  const nodes = [...document.querySelectorAll(".item")];
  selectedIndex = Math.max(0, nodes.findIndex((n) => n.dataset.key === selected));
  for (const node of nodes) {
    const on = node.dataset.key === selected;
    node.classList.toggle("selected", on);
    if (on) node.setAttribute("aria-current", "true");
    else node.removeAttribute("aria-current");
  }
}

function move(step) {
  const nodes = [...document.querySelectorAll(".item")];
  if (!nodes.length) return;
  const at = nodes.findIndex((n) => n.dataset.key === selected);
  const next = nodes[Math.min(nodes.length - 1, Math.max(0, at + step))];
  selected = next.dataset.key;
  highlight();
  next.focus({ preventScroll: true });
  reveal(next, "nearest");
}

// Scroll a question into view below the sticky bar (its scroll-margin), with its workspace's
// heading when it is the first question under it.
function reveal(node, block) {
  const group = node?.closest(".group");
  const first = group?.querySelector(".item") === node;
  (first ? group : node)?.scrollIntoView({ block });
}

// -- one question ---------------------------------------------------------------------------------
function ago(t) {
  const secs = Math.round((Date.now() - t.getTime()) / 1000);
  return secs < 60 ? "just now" : secs < 3600 ? `${Math.floor(secs / 60)} min ago`
    : secs < 86400 ? `${Math.floor(secs / 3600)} h ago` : t.toLocaleString();
}

function when(iso) {
  if (!iso) return null;
  const t = new Date(iso);
  return el("time", { datetime: iso, title: t.toLocaleString() }, ago(t));
}

// What is about to time out: a question whose deadline is at most DUE_SOON_MS away (or passed
// and not yet acted on) is marked on its card, and the heading counts them.
const DUE_SOON_MS = 10 * 60_000;

function dueIn(iso) {
  const ms = new Date(iso).getTime() - Date.now();
  if (ms <= 0) return { soon: true, text: "due now: about to time out" };
  const mins = Math.ceil(ms / 60_000);
  const text = mins < 60 ? `due in ${mins} min` : mins < 1440 ? `due in ${Math.round(mins / 60)} h`
    : `due in ${Math.round(mins / 1440)} d`;
  return { soon: ms <= DUE_SOON_MS, text };
}

function dueMark(r) {
  if (!r.expires_at) return null;
  return el("span", { class: "due", "data-due": r.expires_at });
}

function dueMarks() {
  let soon = 0;
  const counted = new Set();
  for (const node of document.querySelectorAll(".due[data-due]")) {
    const d = dueIn(node.dataset.due);
    node.textContent = d.text;
    node.classList.toggle("due-soon", d.soon);
    const key = node.closest(".item")?.dataset.key;
    if (d.soon && key && !counted.has(key)) { counted.add(key); soon += 1; }
  }
  const count = $("due-count");
  if (count) {
    count.hidden = soon === 0;
    count.textContent = soon ? `· ${soon} due within ${DUE_SOON_MS / 60_000} min` : "";
  }
}

// "3 min ago" and "due in 4 min" stay true while the page is open.
setInterval(() => {
  for (const node of document.querySelectorAll("time[datetime]")) {
    node.textContent = ago(new Date(node.getAttribute("datetime")));
  }
  dueMarks();
}, 30_000);

function card(r) {
  const error = el("p", { class: "error", role: "alert" });
  const promptId = `p-${Math.abs(hash(keyOf(r)))}`;
  return el("article", {
    class: "item", tabindex: "-1", "data-key": keyOf(r), "data-request-id": r.request_id,
    "data-input-type": r.input_type, "aria-labelledby": promptId,
    onclick: (ev) => { if (selected !== keyOf(r)) { selected = keyOf(r); highlight(); } },
  },
    el("div", { class: "meta" },
      el("span", { class: "type" }, r.input_type.replace("_", "/")),
      el("span", {}, r.task),
      r.node_id ? el("span", {}, `node ${r.node_id}`) : null,
      r.timestamp ? el("span", {}, "asked ", when(r.timestamp)) : null,
      dueMark(r),
      r.run_id && !linkToken ? runLink(r.workspace, r.run_id, "run view") : null,
      pickBox(r)),
    el("p", { class: "prompt", id: promptId }, r.prompt),
    el("div", { class: "respondents-slot" }, respondents(r.respondents, r.follow_up)),
    el("div", { class: "handed" }, ...handedView(r.delegations)),
    el("div", { class: "approvals" }, ...approvalsView(r.approvals)),
    el("div", { class: "followup", "data-shown": JSON.stringify(r.follow_up || null) }, ...followUpView(r.follow_up)),
    factsView(r),
    ...(r.calls || []).map(callView),
    answerControls(r, error),
    error,
    handOver(r),
    contextView(r.context),
  );
}

// What `delta status` says of a question, on its card: the answer's bounds (the kind's words), the
// default, the deadline (in UTC, as the CLI and API say it) and what happens at it.
function factsView(r) {
  const facts = [];
  if (r.bounds) facts.push(r.bounds);  // the kind's words: "a number from 1 to 20"
  if (r.default !== null && r.default !== undefined && !r.sensitive) facts.push(`default: ${r.default}`);
  if (r.sensitive) facts.push("secret: kept in a 0600 file, never shown to the agent's model");
  if (r.expires_at) facts.push(`answer by ${utc(r.expires_at)}${r.after_deadline ? `, then ${afterDeadline(r.after_deadline)}` : ""}`);
  if (!facts.length) return null;
  return el("ul", { class: "facts" }, ...facts.map((f) => el("li", {}, f)));
}

// What an unanswered question gets at its deadline, in words for people: the API's
// `TIMEOUT` is what the agent is told.
function afterDeadline(words) {
  return words === "TIMEOUT" ? "the agent is told that nobody answered" : words;
}

// -- handing a question over (POST .../delegate) ---------------------------------------------------
// Who it was handed to, oldest first: each delegate may answer it too.
function handedView(list) {
  if (!Array.isArray(list) || !list.length) return [];
  return [el("ul", { class: "handed-list", "aria-label": "Handed over" }, ...list.map((d) =>
    el("li", {}, `Handed by ${d.by} to `, el("strong", {}, String(d.to)),
      d.note ? ` — “${d.note}”` : "", " ", d.at ? when(d.at) : "")))];
}

// An RFC 3339 time as the card says it: "2026-11-28 17:06:56 UTC".
const utc = (iso) => iso.replace("T", " ").replace(/(\.\d+)?Z$/, " UTC");

// What carried a reminder or an escalation (`via`): [] is nobody (no channel is configured;
// the daemon logs followup_undelivered), null a record from before deltad kept it.
function carried(via) {
  if (!Array.isArray(via)) return null;
  return via.length ? ` (by ${via.join(", ")})` : null;
}

// Reminders and escalation (docs/inbox.md): "Reminded 2 times, last …", "Escalated to bob …"
// — or, when no channel carried them, that nobody was told — and the SLA, a target that ends
// nothing (the card's one "due" is the deadline, which does).
function followUpView(f, withSla = true) {
  if (!f) return [];
  const out = [];
  const sent = Array.isArray(f.reminders) ? f.reminders : [];
  const nobody = "nobody was told: no channel (webhook, email, Slack) is configured";
  if (sent.length) {
    const times = sent.length === 1 ? "once" : `${sent.length} times`;
    const last = when(sent[sent.length - 1]);
    out.push(Array.isArray(f.reminders_via) && !f.reminders_via.length
      ? el("li", { class: "reminded unsent" }, `${sent.length === 1 ? "A reminder" : `${sent.length} reminders`} came due, last `, last, ` — ${nobody}`)
      : el("li", { class: "reminded" }, `Reminded ${times}, last `, last, carried(f.reminders_via)));
  }
  if (f.escalated) {
    const to = (f.escalated.to || []).join(", ");
    const via = f.escalated.via;
    out.push(Array.isArray(via) && !via.length
      ? el("li", { class: "escalated unsent" }, "Escalated to ", el("strong", {}, to), " ", when(f.escalated.at),
        `: they may answer it now, but ${nobody}`)
      : el("li", { class: "escalated" }, "Escalated to ", el("strong", {}, to), " ", when(f.escalated.at), carried(via)));
  }
  if (withSla && f.sla_due_at) {
    const late = Boolean(f.overdue_at) || new Date(f.sla_due_at).getTime() <= Date.now();
    const at = el("span", { class: "sla-at", title: new Date(f.sla_due_at).toLocaleString() }, utc(f.sla_due_at));
    out.push(late
      ? el("li", { class: "sla sla-late" }, "SLA missed: an answer was expected by ", at, " (the question stays open)")
      : el("li", { class: "sla" }, "SLA: an answer is expected by ", at, " (nothing ends then)"));
  }
  return out.length ? [el("ul", { class: "followup-list", "aria-label": "Reminders and escalation" }, ...out)] : [];
}

function showFollowUp(node, r) {
  const slot = node?.querySelector(".followup");
  const text = JSON.stringify(r.follow_up || null);
  if (!slot || slot.dataset.shown === text) return;
  slot.dataset.shown = text;
  slot.replaceChildren(...followUpView(r.follow_up));
  const who = node.querySelector(".respondents-slot");
  who?.replaceChildren(...[respondents(r.respondents, r.follow_up)].filter(Boolean));
}

function showHanded(node, list) {
  const slot = node?.querySelector(".handed");
  const text = JSON.stringify(list || []);
  if (!slot || slot.dataset.shown === text) return;
  slot.dataset.shown = text;
  slot.replaceChildren(...handedView(list));
}

// -- four eyes (approvals_required) ----------------------------------------------------------------
// "1 of 2 approvals: alice": the votes given so far on a question that needs several.
function approvalsView(a) {
  if (!a || typeof a !== "object" || !(a.required > 1)) return [];
  const given = Array.isArray(a.given) ? a.given : [];
  const names = given.map((v) => v.verdict === "approve" || v.verdict === "answer" ? v.by : `${v.by} (${v.verdict})`);
  return [el("p", { class: "approvals-line", role: "status" },
    `${given.length} of ${a.required} approvals`, names.length ? `: ${names.join(", ")}` : "",
    a.owner_may_approve === false ? " — the workspace's owner may not approve" : "")];
}

function showApprovals(node, a) {
  const slot = node?.querySelector(".approvals");
  const text = JSON.stringify(a || null);
  if (!slot || slot.dataset.shown === text) return;
  slot.dataset.shown = text;
  slot.replaceChildren(...approvalsView(a));
}

// A vote recorded, the question still waiting for others: the card stays, saying so.
function voted(node, doc) {
  showApprovals(node, doc.approvals);
  const error = node?.querySelector(".error");
  if (error) error.textContent = "";
  const said = node?.querySelector(".approvals-line");
  if (said) said.textContent += ". Your vote is in; it waits for the others.";
}

// Who the answer stands on, in the history: "approved by alice, bob".
function approvedView(list) {
  if (!Array.isArray(list) || !list.length) return [];
  return [el("span", { class: "approvals-line" }, "votes: ",
    list.map((v) => `${v.by} (${v.verdict || "approve"})`).join(", "))];
}

function handOver(r) {
  if (linkToken) return null;
  const to = el("input", { class: "hand", name: "to", required: "", autocomplete: "off",
    "aria-label": "Hand to: a token name or group:NAME", placeholder: "token name or group:NAME" });
  const note = el("input", { class: "hand", name: "note", autocomplete: "off",
    "aria-label": "Note for them", placeholder: "note (why)" });
  const said = el("p", { class: "error", role: "alert" });
  const sending = el("form", { class: "hand-form" }, to, note, el("button", { type: "submit" }, "Hand over"));
  sending.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    said.textContent = "";
    const path = `v1/requests/${encodeURIComponent(r.request_id)}/delegate?workspace=${encodeURIComponent(r.workspace)}`;
    try {
      const doc = await api("POST", path, { to: to.value.trim(), note: note.value });
      to.value = ""; note.value = "";
      showHanded(sending.closest(".item"), doc.delegations);
    } catch (e) { said.textContent = e.message; }
  });
  return el("details", { class: "handover" }, el("summary", {}, "Hand over"), sending, said);
}

// -- one answer for several questions (POST v1/answers) ---------------------------------------------
// Questions picked on their cards, all of one kind and options (the API checks it again): an
// answer given on any of them goes to each, and each gets its own result.
const picked = new Map();  // keyOf -> question
const shapeOf = (r) => JSON.stringify([r.input_type, r.form, (r.calls || []).map((c) => c.tool_name).sort()]);

function pickBox(r) {
  if (linkToken || r.sensitive) return null;  // a secret is answered one at a time
  const box = el("input", { type: "checkbox", class: "pick", "data-shape": shapeOf(r),
    "aria-label": `Select to answer together: ${r.prompt}`,
    onchange: () => { if (box.checked) picked.set(keyOf(r), r); else picked.delete(keyOf(r)); showPicked(); } });
  return el("label", { class: "pick-label" }, box, "select");
}

// Alike: the same kind and options (what one answer fits) and the same prompt.
const alikeOf = (r) => JSON.stringify([shapeOf(r), r.prompt]);

// The questions on the page alike a selected one and not selected yet.
function unpickedAlike() {
  const wanted = new Set([...picked.values()].map(alikeOf));
  return items.filter((r) => !r.sensitive && !picked.has(keyOf(r)) && wanted.has(alikeOf(r)));
}

function pickAlike() {
  for (const r of unpickedAlike()) {
    picked.set(keyOf(r), r);
    const box = cards.get(keyOf(r))?.querySelector("input.pick");
    if (box) box.checked = true;
  }
  showPicked();
}

function showPicked() {
  const first = picked.values().next().value;
  for (const box of document.querySelectorAll("input.pick")) {
    const other = first && box.dataset.shape !== shapeOf(first);
    box.disabled = Boolean(other) && !box.checked;
    box.title = box.disabled ? "another kind of question, or other options, than those selected" : "";
  }
  const bar = $("bulk");
  if (!bar) return;
  // With nothing selected, the last bulk answer's summary stays until cleared.
  if (picked.size) {
    $("bulk-count").textContent = picked.size > 1
      ? `${picked.size} selected: an answer given on one goes to each of them.`
      : "1 selected: select more questions like it to answer them together.";
  }
  const more = picked.size ? unpickedAlike().length : 0;
  const all = $("bulk-alike");
  if (all) {
    all.hidden = more === 0;
    all.textContent = `Select ${more === 1 ? "the 1 more" : `all ${more} more`} alike (same question, same options)`;
  }
  bar.hidden = picked.size === 0 && !$("bulk-count").textContent;
}

function clearPicked() {
  picked.clear();
  for (const box of document.querySelectorAll("input.pick")) box.checked = false;
  $("bulk-errors").replaceChildren();
  $("bulk-count").textContent = "";
  showPicked();
}

async function sendMany(list, body, error) {
  error.textContent = "";
  $("bulk-errors").replaceChildren();
  const items = list.map((q) => ({ request_id: q.request_id, workspace: q.workspace }));
  try {
    const doc = await api("POST", "v1/answers", { items, answer: body });
    const failed = [];
    doc.results.forEach((res, i) => {
      const q = list[i];
      if (res.status === "accepted") {
        picked.delete(keyOf(q));
        const node = document.querySelector(`.item[data-key="${CSS.escape(keyOf(q))}"]`);
        if (res.answered === false) voted(node, res);
        else node?.replaceChildren(el("p", { class: "done", role: "status" }, "Answered. The agent continues."));
      } else failed.push(el("li", {}, `${q.workspace}: ${res.error} (${res.code})`));
    });
    $("bulk-errors").replaceChildren(...failed);
    $("bulk-count").textContent = `${doc.accepted} answered, ${doc.refused} not.`;
    showPicked();
  } catch (e) {
    error.textContent = e.message;
  }
}

// Who may answer: the respondents, and whom an escalation added ("For alice, and bob since
// the escalation"); [] is anyone, escalated or not.
function respondents(list, f) {
  if (!Array.isArray(list) || !list.length) return null;
  const added = (f?.escalated?.to || []).map(String).filter((n) => !list.includes(n));
  return el("p", { class: "respondents" }, "For ", list.map(String).join(", "),
    added.length ? `, and ${added.join(", ")} since the escalation` : "");
}

// The question's context (last agent message, recent tool calls, reviewed output...): folded,
// its summary the first lines of what matters most; whatever keys it has, none empty. The task
// is on the card's first line already.
function contextView(ctx) {
  if (!ctx || typeof ctx !== "object") return null;
  const empty = (k, v) => v === null || v === undefined || v === "" || k === "task"
    || (Array.isArray(v) && !v.length) || (k.endsWith("_omitted") && !v);
  const rows = Object.entries(ctx).filter(([k, v]) => !empty(k, v));
  if (!rows.length) return null;
  const lead = ctx.reviewed_output || ctx.last_message || "";
  const first = String(lead).split("\n").filter((l) => l.trim()).slice(0, 2).join(" · ");
  const calls = Array.isArray(ctx.tool_calls) && ctx.tool_calls.length
    ? `${ctx.tool_calls.length} tool call${ctx.tool_calls.length > 1 ? "s" : ""}` : "";
  const preview = [first.length > 160 ? `${first.slice(0, 160)}…` : first, calls].filter(Boolean).join(" — ");
  return el("details", { class: "context" },
    el("summary", {}, el("span", { class: "ctx-title" }, "Context"), preview ? el("span", { class: "preview" }, preview) : null),
    ...rows.map(([k, v]) => el("div", { class: "ctx-row" },
      el("h4", {}, k.replaceAll("_", " ")), valueView(v))));
}

function valueView(v) {
  if (typeof v === "string") return el("div", { class: "text" }, v);
  if (Array.isArray(v)) return el("ol", { class: "calls" }, ...v.map((x) => el("li", {}, toolLine(x))));
  return el("pre", {}, JSON.stringify(v, null, 2));
}

function toolLine(x) {
  if (!x || typeof x !== "object") return String(x);
  const name = x.tool_name || x.name || x.tool;
  const rest = { ...x };
  for (const k of ["tool_name", "name", "tool"]) delete rest[k];
  return el("span", {}, name ? el("strong", {}, name) : null, " ",
    el("code", {}, JSON.stringify(rest.arguments ?? rest)),
    rest.status !== undefined ? el("span", { class: "hint" }, ` → ${rest.status}`) : null,
    typeof rest.result === "string" && rest.result ? el("pre", { class: "output" }, rest.result) : null);
}

function callView(c) {
  return el("div", { class: "call", "data-action-id": c.action_id },
    el("div", {}, el("strong", {}, c.tool_name), c.description ? el("span", { class: "hint" }, ` ${c.description}`) : null),
    el("pre", {}, JSON.stringify(c.arguments, null, 2)),
    c.resolved_command ? el("div", {}, "runs: ", el("code", {}, c.resolved_command)) : null);
}

async function send(r, body, error, field) {
  if (!linkToken && picked.size > 1 && picked.has(keyOf(r))) {
    await sendMany([...picked.values()], body, error);
    if (field) field.value = "";
    return;
  }
  error.textContent = "";
  const path = linkToken
    ? `v1/links/${linkToken}/answer`
    // A request id names a question only with its workspace (copies share ids).
    : `v1/requests/${encodeURIComponent(r.request_id)}/answer?workspace=${encodeURIComponent(r.workspace)}`;
  try {
    const doc = await api("POST", path, body);
    if (field) field.value = "";
    const node = document.querySelector(`.item[data-key="${CSS.escape(keyOf(r))}"]`);
    if (doc && doc.answered === false) voted(node, doc);  // four eyes: others must agree too
    else node?.replaceChildren(el("p", { class: "done", role: "status" }, "Answered. The agent continues."));
    if (linkToken) $("link-status").textContent = "Thank you: your answer is in.";
  } catch (e) {
    if (field && r.sensitive) field.value = "";
    error.textContent = e.message;
  }
}

function keyButton(key, label, onclick, cls) {
  return el("button", { type: "button", class: cls || "", "data-key": key.toLowerCase(), "aria-keyshortcuts": key.toLowerCase(), onclick },
    el("kbd", { "aria-hidden": "true" }, key), " ", label);
}

// The answer form is the question's kind's (the API's `form`, deltad/protocol/kinds.py): the
// page knows the controls — a typed input, a button per answer, a button per decision on the
// gated calls — and never the kinds, so a new input type needs no change here.
function answerControls(r, error) {
  const form = r.form || { control: "input", type: "text" };
  switch (form.control) {
    case "keys": {
      const isDefault = (k) => r.default !== null && r.default !== undefined
        && [k.answer, k.label, k.key].some((v) => v && String(v).toLowerCase() === String(r.default).toLowerCase());
      return el("div", { class: "actions" }, ...form.keys.map((k) => {
        const b = keyButton(k.key, k.label, () => send(r, { answer: k.answer }, error), k.style);
        if (isDefault(k)) { b.classList.add("default"); b.append(el("span", { class: "badge" }, " (default)")); }
        return b;
      }));
    }
    case "decisions":
      return decisionControls(r, form.keys, error);
    default:
      return freeText(r, form, error);
  }
}

function freeText(r, form, error) {
  const secret = form.type === "password";  // the kind hides every secret's answer
  const field = el("input", {
    class: "answer", type: form.type || "text",
    // "off" only where it is allowed: a text field (a date's or a number's would be invalid).
    autocomplete: secret ? "new-password" : form.type === "text" ? "off" : null, placeholder: r.default ? `default: ${r.default}` : "",
    "aria-label": `Answer: ${r.prompt}`,
    // The kind's own attributes: a number's or a date's bounds as the browser's hints; the
    // API checks them again (422).
    ...form.attrs,
  });
  const sending = el("form", { class: "actions" }, field, el("button", { type: "submit", class: "primary" }, "Send"));
  sending.addEventListener("submit", (ev) => {
    ev.preventDefault();
    send(r, { answer: field.value }, error, field);
  });
  return sending;
}

function decisionControls(r, keys, error) {
  const reason = el("input", { class: "reason", placeholder: "reason (for a reject)", "aria-label": "Reason for a reject" });
  const editors = el("div", { class: "editors" });
  const decide = (decision, extra = {}) => send(r, {
    decisions: r.calls.map((c) => ({ action_id: c.action_id, decision, ...extra })),
  }, error);
  const openEditors = () => {
    editors.replaceChildren(...r.calls.map(callEditor),
      el("button", { type: "button", class: "send-edit primary", onclick: sendEdit }, "Send edit"));
    editors.querySelector("input, select, textarea")?.focus();
  };
  const sendEdit = () => {
    const decisions = [];
    for (const c of r.calls) {
      const box = editors.querySelector(`fieldset[data-action-id="${CSS.escape(c.action_id)}"]`);
      let args;
      try { args = editedArguments(box, c); } catch (e) { error.textContent = `${c.tool_name}: ${e.message}`; return; }
      const problem = checkSchema(c.schema, args);
      if (problem) { error.textContent = `${c.tool_name}: ${problem}`; return; }
      decisions.push({ action_id: c.action_id, decision: "edit", arguments: args });
    }
    send(r, { decisions }, error);
  };
  // A button per decision, in the kind's order; `edit` opens the arguments first, and a
  // decision that takes a reason has the reason field beside it.
  const buttons = keys.flatMap((k) => {
    const onclick = k.decision === "edit" ? openEditors
      : () => decide(k.decision, k.reason && reason.value ? { reason: reason.value } : {});
    const button = keyButton(k.key, k.label, onclick, k.style);
    return k.reason ? [button, reason] : [button];
  });
  return el("div", {}, el("div", { class: "actions" }, ...buttons), editors);
}

// One gated call's arguments as a form made from the tool's JSON schema (as the model sees
// it): a text box per string, a number box per number, a checkbox per boolean, a list per
// enum; anything else (objects, arrays, a tool with no schema) as JSON. "JSON" shows the
// whole call as JSON instead, for what the form cannot say.
function callEditor(c) {
  const props = c.schema?.properties || {};
  const names = [...new Set([...Object.keys(props), ...Object.keys(c.arguments || {})])];
  const fields = names.map((name) => argField(name, props[name], (c.arguments || {})[name], (c.schema?.required || []).includes(name)));
  const raw = el("textarea", { class: "raw", "aria-label": `${c.tool_name} arguments as JSON`, hidden: "" }, JSON.stringify(c.arguments, null, 2));
  const form = el("div", { class: "arg-fields" }, ...fields);
  const toggle = el("button", { type: "button", class: "quiet json-toggle", onclick: () => {
    const toJson = raw.hidden;
    if (toJson) { try { raw.value = JSON.stringify(formArguments(form), null, 2); } catch (e) { /* as it was */ } }
    raw.hidden = !toJson; form.hidden = toJson;
    toggle.textContent = toJson ? "Form" : "JSON";
  } }, "JSON");
  return el("fieldset", { class: "call-editor", "data-action-id": c.action_id },
    el("legend", {}, `${c.tool_name}: arguments`, " ", toggle), form, raw);
}

function argField(name, spec, value, required) {
  const id = `arg-${Math.abs(hash(name + Math.random()))}`;
  const label = el("label", { for: id }, name, required ? " *" : "", spec?.description ? el("span", { class: "hint" }, ` ${spec.description}`) : null);
  const t = spec?.type;
  let input;
  if (Array.isArray(spec?.enum)) {
    input = el("select", { id }, ...spec.enum.map((v) => el("option", { value: JSON.stringify(v), selected: v === value ? "" : null }, String(v))));
  } else if (t === "boolean") {
    input = el("input", { id, type: "checkbox", checked: value ? "" : null });
  } else if (t === "integer" || t === "number") {
    input = el("input", { id, type: "number", step: t === "integer" ? "1" : "any", value: value ?? "" });
  } else if (t === "string" || (t === undefined && typeof value === "string")) {
    input = el("input", { id, type: "text", value: value ?? "" });
  } else {
    input = el("textarea", { id, "data-json": "" }, value === undefined ? "" : JSON.stringify(value, null, 2));
  }
  input.dataset.arg = name;
  input.dataset.kind = Array.isArray(spec?.enum) ? "enum" : t || (typeof value === "string" ? "string" : "json");
  return el("div", { class: "arg" }, label, input);
}

function formArguments(form) {
  const args = {};
  for (const input of form.querySelectorAll("[data-arg]")) {
    const name = input.dataset.arg, kind = input.dataset.kind;
    if (kind === "boolean") args[name] = input.checked;
    else if (kind === "enum") args[name] = JSON.parse(input.value);
    else if (kind === "integer" || kind === "number") {
      if (input.value === "") continue;
      args[name] = Number(input.value);
    } else if (kind === "string") {
      if (input.value === "" && !input.closest(".arg").querySelector("label").textContent.includes("*")) continue;
      args[name] = input.value;
    } else {
      if (!input.value.trim()) continue;
      try { args[name] = JSON.parse(input.value); } catch (e) { throw new Error(`${name}: not JSON: ${e.message}`); }
    }
  }
  return args;
}

function editedArguments(box, c) {
  const raw = box.querySelector("textarea.raw");
  if (!raw.hidden) {
    try { return JSON.parse(raw.value); } catch (e) { throw new Error(`not JSON: ${e.message}`); }
  }
  return formArguments(box.querySelector(".arg-fields"));
}

// The tool's parameter schema (JSON Schema, as the model sees it), checked before sending.
function checkSchema(schema, args) {
  if (typeof args !== "object" || args === null || Array.isArray(args)) return "arguments must be a JSON object";
  if (!schema) return null;
  for (const name of schema.required || []) if (!(name in args)) return `missing required argument ${name}`;
  const props = schema.properties || {};
  for (const [name, value] of Object.entries(args)) {
    const spec = props[name];
    if (!spec) return `unknown argument ${name}`;
    const t = spec.type;
    const ok = t === "integer" ? Number.isInteger(value)
      : t === "number" ? typeof value === "number"
      : t === "boolean" ? typeof value === "boolean"
      : t === "string" ? typeof value === "string" : true;
    if (!ok) return `${name} must be a ${t}`;
  }
  return null;
}

// -- history: from the journals (kept across reloads and restarts), then live events ---------------
function historySoon() {
  clearTimeout(historyTimer);
  historyTimer = setTimeout(loadHistory, 300);  // a burst of events: one reload
}

let historyLoads = 0;
async function loadHistory() {
  const mine = ++historyLoads;
  try {
    const doc = await api("GET", "v1/history?limit=100");
    if (mine !== historyLoads) return;  // a newer load is on its way
    const byRun = answersByRun(doc.history);
    $("activity").replaceChildren(...doc.history.map((h) => historyItem(h, byRun)));
    $("history-empty").hidden = doc.history.length > 0;
  } catch (e) { /* kept as it was */ }
}

const runKey = (h) => `${h.workspace}\u0000${h.run_id}`;

// The answers of each run in this history, oldest first: shown again with the run's end.
function answersByRun(history) {
  const out = new Map();
  for (const h of [...history].reverse()) {
    if (h.kind !== "answered") continue;
    if (!out.has(runKey(h))) out.set(runKey(h), []);
    out.get(runKey(h)).push(h);
  }
  return out;
}

function historyItem(h, byRun) {
  if (h.kind === "run_ended") {
    const status = String(h.status);
    const took = typeof h.duration_seconds === "number" ? ` in ${duration(h.duration_seconds)}` : "";
    return el("li", { class: `ended ${status.toLowerCase()}`, "data-type": "run.status", "data-to": status, "data-run": h.run_id },
      el("span", { class: "what" }, `run ${status.toLowerCase()}${took}`, h.reason ? `: ${h.reason}` : ""),
      el("span", { class: "where" }, h.workspace, " ", runLink(h.workspace, h.run_id, "run view")), when(h.at),
      outcomeView(h, byRun.get(runKey(h)) || []));
  }
  return el("li", { class: `answered ${timedOut(h) ? "timeout" : ""}`, "data-type": "request.answered" },
    el("span", { class: "what" }, ...happened(h)),
    ...editsView(h),
    ...handedView(h.delegations),
    ...approvedView(h.approvals),
    ...followUpView(h.follow_up, false),  // answered: who was reminded, escalated to whom
    h.prompt ? el("span", { class: "asked" }, h.prompt) : null,
    el("span", { class: "where" }, h.workspace, " ", runLink(h.workspace, h.run_id, "run view")), when(h.at));
}

// A timeout's default is the deadline's answer, not a person's.
function timedOut(h) {
  return ["timeout", "default"].includes(h.channel) || ["timeout", "timed_out"].includes(h.outcome);
}

// One line for what happened: "alice approved", "timed out → default “beta”", "bob answered
// (a secret, not shown)", "carol approved deploy with edits".
function happened(h) {
  if (timedOut(h)) {
    return h.answer !== null && h.answer !== undefined
      ? ["timed out → default ", el("strong", {}, `“${h.answer}”`)]
      : ["timed out: nobody answered (the agent was told so)"];
  }
  const who = h.answered_by || "someone";
  const via = h.channel && !["http", "file"].includes(h.channel) ? ` (${h.channel})` : "";
  if (h.decisions?.length) {
    const words = { approve: "approved", reject: "rejected", edit: "approved with edits", cancel: "canceled the run at" };
    const parts = h.decisions.map((d) => `${words[d.decision] || d.decision} ${d.tool_name || d.action_id || ""}`.trim()
      + (d.reason ? `: “${d.reason}”` : ""));
    return [`${who}${via} `, el("strong", {}, parts.join("; "))];
  }
  if (h.answer === null || h.answer === undefined) {
    return h.outcome === "answered" ? [`${who}${via} answered `, el("em", {}, "(a secret, not shown)")]
      : [`${who}${via}: `, el("strong", {}, String(h.outcome || ""))];
  }
  return [`${who}${via} answered `, el("strong", {}, `“${h.answer}”`)];
}

// What an edit changed: one line per argument, as asked → as run.
function editsView(h) {
  return (h.decisions || []).filter((d) => d.decision === "edit" && d.arguments).map((d) => {
    const before = d.asked_arguments || {}, after = d.arguments;
    const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])]
      .filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]));
    return el("ul", { class: "diff", "aria-label": `what the edit of ${d.tool_name || "the call"} changed` },
      ...keys.map((k) => el("li", {}, el("code", {}, k), ": ",
        k in before ? el("del", {}, JSON.stringify(before[k])) : el("em", {}, "(not set)"), " → ",
        k in after ? el("ins", {}, JSON.stringify(after[k])) : el("em", {}, "(removed)"))));
  });
}

// A finished run, folded: its final message (as text, never markup; a long one is cut by the
// server, the whole of it is in `delta status`) and who answered what in it.
function outcomeView(h, answers) {
  const message = h.status === "COMPLETED" && h.final_message ? h.final_message : null;
  if (!message && !answers.length) return null;
  return el("details", { class: "outcome" },
    el("summary", {}, message ? "Final message" : "Answers", message && answers.length ? " and answers" : ""),
    message ? el("div", { class: "final-message" }, message) : null,
    h.final_message_truncated ? el("p", { class: "hint" }, "(cut: delta status shows all of it)") : null,
    answers.length ? el("ol", { class: "answers" }, ...answers.map((a) => el("li", {},
      ...happened(a), a.prompt ? ` (${a.prompt})` : ""))) : null);
}

// As `delta status` says it: "4.2 s", "3 min 05 s", "1 h 02 min 00 s".
function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${seconds.toFixed(1)} s`;
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h} h ${pad(m)} min ${pad(r)} s` : `${m} min ${pad(r)} s`;
}

function activity(e) {
  if (e.type === "request.answered") return;  // the history shows it, with who
  const text = e.type === "run.status"
    ? `run ${e.from ? e.from.toLowerCase() : "new"} → ${String(e.to).toLowerCase()}`
    : e.type === "request.created" ? "new question"
    : e.type === "request.reminder" ? `reminder ${e.reminder || ""} sent`
    : e.type === "request.escalated" ? `escalated to ${(e.escalated_to || []).join(", ")}`
    : e.type === "request.overdue" ? "overdue (past its SLA)"
    : "question expired";
  const li = el("li", { class: "live", "data-type": e.type, "data-to": e.to || "" },
    el("span", { class: "what" }, text), el("span", { class: "where" }, e.workspace), when(e.at));
  $("activity").prepend(li);
  $("history-empty").hidden = true;
}

// -- a run's view: its messages, tool calls with their output, questions and answers, and how
// its status moved (the API's run document, the journal's last events) -------------------------
function runLink(workspace, runId, text) {
  if (!runId || linkToken) return null;
  return el("button", { type: "button", class: "link run-link", "data-run": runId,
    onclick: (ev) => { ev.stopPropagation(); showRun(workspace, runId); } }, text);
}

async function showRun(workspace, runId) {
  const dialog = $("run-view");
  const body = $("run-body");
  $("run-title").textContent = `Run ${runId}`;
  body.replaceChildren(el("p", { class: "hint" }, "loading…"));
  if (!dialog.open) dialog.showModal();
  try {
    const run = await api("GET", `v1/runs/${encodeURIComponent(runId)}?workspace=${encodeURIComponent(workspace)}`);
    body.replaceChildren(runView(run));
  } catch (e) {
    body.replaceChildren(el("p", { class: "error", role: "alert" }, e.message));
  }
}

function runView(run) {
  const facts = el("dl", { class: "run-facts" },
    ...[["status", run.status], ["task", run.task], ["agent", run.agent], ["workspace", run.workspace],
      ["started", run.start_time], ["ended", run.end_time], ["error", run.error]]
      .filter(([, v]) => v).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
  const steps = (run.journal || []).map(journalItem).filter(Boolean);
  return el("div", {}, facts,
    el("h3", {}, "What happened", el("span", { class: "hint" }, ` (the last ${steps.length} steps)`)),
    el("ol", { class: "transcript" }, ...steps));
}

function journalItem(e) {
  const p = e.payload || {};
  const at = e.timestamp ? when(e.timestamp) : null;
  const item = (cls, title, ...rest) => el("li", { class: `step ${cls}`, "data-type": e.type },
    el("div", { class: "step-head" }, el("strong", {}, title), " ", at), ...rest);
  switch (e.type) {
    case "RUN_START": return item("status", "run started", p.task ? el("div", {}, p.task) : null);
    case "THOUGHT": {
      const calls = (p.tool_calls || []).map((c) => `${c.function?.name}(${c.function?.arguments ?? ""})`);
      if (!p.content && !calls.length) return null;
      return item("message", "the model", p.content ? el("div", { class: "text" }, p.content) : null,
        calls.length ? el("div", { class: "hint" }, "calls ", calls.join(", ")) : null);
    }
    case "ACTION_REQUEST": return item("call", `tool call: ${p.tool_name}`,
      el("code", {}, JSON.stringify(p.tool_args ?? {})), p.resolved_command ? el("div", { class: "hint" }, "runs: ", el("code", {}, p.resolved_command)) : null);
    case "ACTION_RESULT": return item("result", `tool result: ${p.status}`, el("pre", { class: "output" }, p.observation_content || ""));
    case "HUMAN_INTERACTION":
      if (p.phase === "asked") return item("question", `asked (${p.request?.input_type || "text"})`, el("div", {}, p.request?.prompt || ""));
      if (p.phase === "answered") return item("answer", "answered", el("div", {}, ...happened({
        ...(p.reply || {}), channel: p.reply?.channel || p.reply?.source,
        answer: p.reply?.value ?? null, decisions: p.reply?.decisions || [] })));
      return null;
    case "SYSTEM_MESSAGE": return item("system", `note (${(p.level || "info").toLowerCase()})`, el("div", { class: "text" }, p.content || ""));
    case "NODE_START": return item("status", `node ${p.node} (${p.kind})`);
    case "NODE_OUTCOME": return item("status", `node ${p.node}: ${p.status}`, p.failure_reason ? el("div", {}, p.failure_reason) : null);
    case "EDGE_TAKEN": return item("status", `${p.source} → ${p.target}`, p.reason ? el("div", { class: "hint" }, p.reason) : null);
    case "RUN_END": return item("status", `run ${String(p.status).toLowerCase()}`, p.reason ? el("div", { class: "text" }, p.reason) : null);
    default: return item("other", e.type.toLowerCase().replaceAll("_", " "));
  }
}

// -- the keyboard ---------------------------------------------------------------------------------
document.addEventListener("keydown", (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const help = $("help");
  if (help?.open || $("run-view")?.open) return;  // a dialog handles Esc itself
  const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName);
  if (typing) {
    if (ev.key === "Escape") { document.activeElement.blur(); selectedNode()?.focus(); }
    return;
  }
  if (mode === "inbox" && $("inbox").hidden) return;
  const node = selectedNode();
  // An accelerator is matched without case, as the terminal and `delta respond` do; it wins
  // over the navigation letters (an option keyed j or k still answers).
  const button = node?.querySelector(`button[data-key="${CSS.escape(ev.key.toLowerCase())}"]`);
  if (button) { ev.preventDefault(); button.click(); return; }
  const act = {
    j: () => move(1), ArrowDown: () => move(1), k: () => move(-1), ArrowUp: () => move(-1),
    i: () => node?.querySelector("input.answer, textarea, input:not(.pick):not(.hand)")?.focus(),
    "/": () => $("f-workspace")?.focus(),
    "?": () => help?.showModal(),
  }[ev.key];
  if (act) { ev.preventDefault(); act(); }
});

$("help-open")?.addEventListener("click", () => $("help").showModal());
$("bulk-clear")?.addEventListener("click", clearPicked);
$("bulk-alike")?.addEventListener("click", pickAlike);

// -- a signed link: one question, no login --------------------------------------------------------
async function loadLink() {
  try {
    const r = await api("GET", `v1/links/${linkToken}`);
    items = [r];
    selected = keyOf(r);
    $("link-status").textContent = "";
    $("requests").replaceChildren(card(r));
    dueMarks();
    highlight();
  } catch (e) {
    $("link-status").textContent = e.message;
  }
}

start();
