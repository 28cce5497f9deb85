// The live page's script: reads the admin API's JSON every 2 s and fills
// the page. No framework, no build step, nothing fetched from elsewhere.
// Every value from the API is set as text (textContent), never as HTML:
// keys are made from what clients send.
"use strict";

const POLL_MS = 2000;
const HISTORY = 150; // points kept per rule: 5 minutes at 2 s
const history = new Map(); // rule -> [{t, allowed, rejected}]
let last = null; // the previous /v1/rules answer and its time

// The API's URL for `path`, from the page's origin: a page opened as
// http://user:token@host/ui has its credentials in its own URL, and a
// fetch of a path relative to it is refused ("Request cannot be
// constructed from a URL that includes credentials"). The origin has none;
// the browser still sends the Basic credentials it holds for it.
function api(path) {
  return new URL(path, window.location.origin).href;
}

async function getJson(path, init) {
  const r = await fetch(api(path), Object.assign({ credentials: "same-origin" }, init));
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// Seconds to a tenth.
function secs(s) {
  return Number(s).toFixed(1);
}

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = c instanceof Node ? (() => { const d = el("td"); d.appendChild(c); return d; })() : el("td", c);
    tr.appendChild(td);
  }
  if (attrs) for (const [k, v] of Object.entries(attrs)) tr.setAttribute(k, v);
  return tr;
}

// Decisions/s per rule since the previous poll, kept for the sparklines.
function rates(rules, now) {
  const out = new Map();
  for (const r of rules) {
    const d = r.decisions;
    let a = 0, j = 0;
    if (last) {
      const p = last.rules.find((x) => x.name === r.name);
      const dt = (now - last.t) / 1000;
      if (p && dt > 0) {
        a = Math.max(0, d.allowed - p.decisions.allowed) / dt;
        j = Math.max(0, d.rejected - p.decisions.rejected) / dt;
      }
    }
    const h = history.get(r.name) || [];
    if (last) h.push({ t: now, allowed: a, rejected: j });
    while (h.length > HISTORY) h.shift();
    history.set(r.name, h);
    out.set(r.name, { allowed: a, rejected: j });
  }
  last = { t: now, rules };
  return out;
}

function spark(points) {
  const ns = "http://www.w3.org/2000/svg";
  const w = 300, h = 40;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const max = Math.max(1, ...points.map((p) => Math.max(p.allowed, p.rejected)));
  for (const [field, colour] of [["allowed", "#1f77b4"], ["rejected", "#d62728"]]) {
    const line = document.createElementNS(ns, "polyline");
    const pts = points.map((p, i) => `${(i / (HISTORY - 1)) * w},${h - (p[field] / max) * (h - 2) - 1}`);
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour);
    line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
  }
  return svg;
}

async function clearKey(rule, key) {
  await fetch(api(`/v1/keys/${encodeURIComponent(rule)}/${encodeURIComponent(key)}`), {
    method: "DELETE",
    credentials: "same-origin",
  });
  refresh();
}

async function removeOverride(rule, key) {
  await fetch(api(`/v1/overrides/${encodeURIComponent(rule)}/${encodeURIComponent(key)}`), {
    method: "DELETE",
    credentials: "same-origin",
  });
  refresh();
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const now = Date.now();
    const { rules } = await getJson("/v1/rules");
    const r = rates(rules, now);
    const body = document.getElementById("rates");
    body.replaceChildren();
    for (const rule of rules) {
      const x = r.get(rule.name);
      body.appendChild(row([
        rule.name,
        x.allowed.toFixed(1),
        x.rejected.toFixed(1),
        rule.decisions.allowed,
        rule.decisions.rejected,
        spark(history.get(rule.name)),
      ], { "data-rule": rule.name }));
    }
    const keys = document.getElementById("keys");
    const rows = [];
    for (const rule of rules) {
      const k = await getJson(`/v1/keys?rule=${encodeURIComponent(rule.name)}&limit=10`);
      for (const key of k.keys) {
        const b = el("button", "clear");
        b.addEventListener("click", () => clearKey(rule.name, key.key));
        rows.push(row([rule.name, key.key, `${Math.round(key.used * 100)}%`, charged(rule, key.charged), key.remaining,
          key.limit, secs(key.reset_after), key.ban_left === null ? "" : secs(key.ban_left), b],
          { "data-rule": rule.name, "data-key": key.key }));
      }
    }
    keys.replaceChildren(...rows);
    const { bans } = await getJson("/v1/bans?limit=50");
    document.getElementById("bans").replaceChildren(
      ...bans.map((b) => row([b.rule, b.key, secs(b.ban_left)], { "data-rule": b.rule, "data-key": b.key })));
    const { overrides } = await getJson("/v1/overrides");
    document.getElementById("overrides").replaceChildren(...overrides.map((o) => {
      const b = el("button", "remove");
      b.addEventListener("click", () => removeOverride(o.rule, o.key));
      return row([o.rule, o.key, o.unlimited ? "unlimited" : (o.limit ?? ""), o.window === undefined ? "" : secs(o.window),
        o.expires_in === undefined ? "" : secs(o.expires_in), o.note ?? "", b], { "data-rule": o.rule, "data-key": o.key });
    }));
    status.textContent = "updated " + new Date(now).toLocaleTimeString();
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  } catch (e) {
    status.textContent = "cannot read the admin API: " + e.message;
  }
}

// What a key was charged in its window, in its rule's units: tokens for a
// rule charged by an LLM's usage, money (millionths counted) under a price
// table, else the count.
function charged(rule, n) {
  const units = rule.charged_by ? rule.charged_by.units : "requests";
  if (units === "money") return (n / 1e6).toFixed(2);
  return `${n} ${units}`;
}

refresh();
setInterval(refresh, POLL_MS);
