// The web inbox: plain DOM, no build step. Every answer goes to the same API as any client;
// the page keeps no token and no answer (a password field is cleared as it is sent).
"use strict";

const mode = document.body.dataset.mode;
const linkToken = mode === "link" ? location.pathname.split("/").pop() : null;
let csrf = null;
let selected = null;
let items = [];
let deepLinked = false;

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (csrf && method !== "GET") headers["X-CSRF-Token"] = csrf;
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let doc = {};
  try { doc = await r.json(); } catch (e) { /* an empty body */ }
  if (!r.ok) {
    const err = new Error(doc.error || `HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return doc;
}

// -- login ------------------------------------------------------------------------------------
async function start() {
  if (mode === "link") return loadLink();
  try {
    const me = await api("GET", "/v1/session");
    signedIn(me);
  } catch (e) {
    $("login").hidden = false;
  }
}

function signedIn(me) {
  csrf = me.csrf;
  $("who").textContent = `${me.name} (${me.role})`;
  $("login").hidden = true;
  $("inbox").hidden = false;
  $("logout").hidden = false;
  refresh();
  follow();
}

$("login-form")?.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const field = $("token");
  const token = field.value.trim();
  field.value = "";
  try {
    signedIn(await api("POST", "/v1/session", { token }));
    $("login-error").textContent = "";
  } catch (e) {
    $("login-error").textContent = e.message;
  }
});

$("logout")?.addEventListener("click", async () => {
  await api("DELETE", "/v1/session").catch(() => {});
  location.reload();
});

// -- the list, kept live by the event stream ------------------------------------------------------
async function refresh() {
  const params = new URLSearchParams();
  const ws = $("f-workspace").value.trim();
  const type = $("f-type").value;
  if (ws) params.set("workspace", ws);
  if (type) params.set("input_type", type);
  try {
    const doc = await api("GET", "/v1/requests?" + params);
    items = doc.requests;
    render();
  } catch (e) {
    if (e.status === 401) location.reload();
  }
}

function follow() {
  const source = new EventSource("/v1/events");
  source.onopen = () => { $("live").textContent = "live"; };
  source.onerror = () => { $("live").textContent = "reconnecting…"; };
  for (const type of ["request.created", "request.answered", "request.expired", "run.status"]) {
    source.addEventListener(type, (msg) => {
      const e = JSON.parse(msg.data);
      activity(e);
      refresh();
    });
  }
}

function activity(e) {
  const text = e.type === "run.status"
    ? `run ${e.run_id} in ${e.workspace}: ${e.from || "new"} → ${e.to}`
    : `${e.type.replace("request.", "question ")} in ${e.workspace}`;
  const li = el("li", { class: e.to === "COMPLETED" ? "done" : "", "data-type": e.type, "data-to": e.to || "" }, text);
  $("activity").prepend(li);
}

$("filters")?.addEventListener("input", () => refresh());
$("filters")?.addEventListener("submit", (ev) => { ev.preventDefault(); refresh(); });

function render() {
  const box = $("requests");
  box.replaceChildren(...items.map(card));
  if ($("empty")) $("empty").hidden = items.length > 0;
  const linked = new URLSearchParams(location.hash.slice(1)).get("request");
  if (linked && items.some((r) => r.request_id === linked) && !deepLinked) {
    selected = linked;  // a notification's deep link: that question, once
    deepLinked = true;
  }
  if (!items.some((r) => r.request_id === selected)) selected = items[0]?.request_id ?? null;
  highlight();
  if (selected === linked) document.querySelector(`[data-request-id="${linked}"]`)?.scrollIntoView();
}

function highlight() {
  for (const node of document.querySelectorAll(".item")) {
    node.classList.toggle("selected", node.dataset.requestId === selected);
  }
}

// -- one question ---------------------------------------------------------------------------------
function card(r) {
  const error = el("p", { class: "error", role: "alert" });
  const node = el("article", {
    class: "item", "data-request-id": r.request_id, "data-input-type": r.input_type,
    onclick: () => { selected = r.request_id; highlight(); },
  },
    el("div", { class: "meta" },
      `${r.task} · agent ${r.agent} · ${r.workspace} · ${r.input_type}`,
      r.node_id ? ` · pipeline node ${r.node_id}` : "",
      r.expires_at ? ` · answer before ${new Date(r.expires_at).toLocaleString()}` : ""),
    el("div", { class: "prompt" }, r.prompt),
    r.respondents?.length ? el("div", { class: "hint" }, `Who may answer: ${r.respondents.join(", ")}`) : null,
    contextView(r.context),
    ...(r.calls || []).map(callView),
    answerControls(r, error),
    error,
  );
  return node;
}

// What the person decides with (request.json's context); text only, never HTML.
function contextView(ctx) {
  if (!ctx) return null;
  const calls = ctx.tool_calls || [];
  const omitted = ctx.tool_calls_omitted ? ` (${ctx.tool_calls_omitted} earlier not shown)` : "";
  return el("details", { class: "context", open: ctx.reviewed_output ? "" : null },
    el("summary", {}, "Context"),
    ctx.reviewed_output ? el("div", {}, el("strong", {}, `Output of ${ctx.reviewed_node} (under review)`),
      el("pre", {}, ctx.reviewed_output)) : null,
    ctx.last_message ? el("div", {}, el("strong", {}, "The agent said"), el("pre", {}, ctx.last_message)) : null,
    calls.length ? el("div", {}, el("strong", {}, `Tool calls since the last question${omitted}`),
      ...calls.map((c) => el("div", { class: "call" },
        el("code", {}, `${c.tool_name} ${JSON.stringify(c.arguments)} → ${c.status || "no result"}`),
        c.result ? el("pre", {}, c.result) : null))) : null);
}

function callView(c) {
  return el("div", { class: "call", "data-action-id": c.action_id },
    el("strong", {}, c.tool_name), " ",
    el("pre", {}, JSON.stringify(c.arguments, null, 2)),
    c.resolved_command ? el("div", {}, "runs: ", el("code", {}, c.resolved_command)) : null);
}

async function send(r, body, error, field) {
  error.textContent = "";
  const path = linkToken
    ? `/v1/links/${linkToken}/answer`
    // A request id names a question only with its workspace (copies share ids).
    : `/v1/requests/${encodeURIComponent(r.request_id)}/answer?workspace=${encodeURIComponent(r.workspace)}`;
  try {
    await api("POST", path, body);
    if (field) field.value = "";
    const node = document.querySelector(`[data-request-id="${r.request_id}"]`);
    node?.replaceChildren(el("p", { class: "done" }, "Answered. The agent continues."));
    if (linkToken) $("link-status").textContent = "Thank you: your answer is in.";
  } catch (e) {
    if (field && r.sensitive) field.value = "";
    error.textContent = e.message;
  }
}

function answerControls(r, error) {
  const say = (answer, comment) => send(r, comment ? { answer, comment } : { answer }, error);
  switch (r.input_type) {
    case "choice":
      return el("div", { class: "actions" }, ...r.options.map((o) =>
        el("button", { type: "button", "data-key": o.key.toLowerCase(), onclick: () => say(o.key) },
          el("kbd", {}, o.key), " ", o.label)));
    case "yes_no":
    case "confirmation":
      return el("div", { class: "actions" },
        el("button", { type: "button", "data-key": "y", onclick: () => say("yes") }, el("kbd", {}, "y"), " Yes"),
        el("button", { type: "button", "data-key": "n", onclick: () => say("no") }, el("kbd", {}, "n"), " No"));
    case "approval":
      return approvalControls(r, error);
    default:
      return freeText(r, error);
  }
}

function freeText(r, error) {
  const secret = r.input_type === "password" || r.sensitive;
  const field = el("input", {
    class: "answer", type: secret ? "password" : (r.input_type === "number" ? "number" : "text"),
    autocomplete: secret ? "new-password" : "off", placeholder: r.default ? `default: ${r.default}` : "",
  });
  const form = el("form", { class: "actions" }, field, el("button", { type: "submit" }, "Send"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    send(r, { answer: field.value }, error, field);
  });
  return form;
}

function approvalControls(r, error) {
  const reason = el("input", { class: "reason", placeholder: "reason (for a reject)" });
  const editors = el("div", { class: "editors" });
  const decide = (decision, extra = {}) => send(r, {
    decisions: r.calls.map((c) => ({ action_id: c.action_id, decision, ...extra })),
  }, error);
  const openEditors = () => {
    editors.replaceChildren(...r.calls.map((c) => el("label", {},
      `${c.tool_name} arguments (JSON)`,
      el("textarea", { "data-action-id": c.action_id }, JSON.stringify(c.arguments, null, 2)))),
      el("button", { type: "button", class: "send-edit", onclick: sendEdit }, "Send edit"));
  };
  const sendEdit = () => {
    const decisions = [];
    for (const c of r.calls) {
      const text = editors.querySelector(`textarea[data-action-id="${c.action_id}"]`).value;
      let args;
      try { args = JSON.parse(text); } catch (e) { error.textContent = `${c.tool_name}: not JSON: ${e.message}`; return; }
      const problem = checkSchema(c.schema, args);
      if (problem) { error.textContent = `${c.tool_name}: ${problem}`; return; }
      decisions.push({ action_id: c.action_id, decision: "edit", arguments: args });
    }
    send(r, { decisions }, error);
  };
  return el("div", {},
    el("div", { class: "actions" },
      el("button", { type: "button", "data-key": "a", onclick: () => decide("approve") }, el("kbd", {}, "a"), " Approve"),
      el("button", { type: "button", "data-key": "r", onclick: () => decide("reject", reason.value ? { reason: reason.value } : {}) }, el("kbd", {}, "r"), " Reject"),
      reason,
      el("button", { type: "button", "data-key": "e", class: "edit", onclick: openEditors }, el("kbd", {}, "e"), " Edit"),
      el("button", { type: "button", "data-key": "c", onclick: () => decide("cancel") }, el("kbd", {}, "c"), " Cancel run")),
    editors);
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

// Keyboard shortcuts: an option's key answers the selected question (not while typing).
document.addEventListener("keydown", (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName)) return;
  const node = document.querySelector(`.item[data-request-id="${selected}"]`);
  // Keys are matched without case, as the terminal and `delta respond` do.
  const button = node?.querySelector(`button[data-key="${CSS.escape(ev.key.toLowerCase())}"]`);
  if (button) { ev.preventDefault(); button.click(); }
});

// -- a signed link: one question, no login --------------------------------------------------------
async function loadLink() {
  try {
    const r = await api("GET", `/v1/links/${linkToken}`);
    items = [r];
    selected = r.request_id;
    $("link-status").textContent = "";
    $("requests").replaceChildren(card(r));
    highlight();
  } catch (e) {
    $("link-status").textContent = e.message;
  }
}

start();
