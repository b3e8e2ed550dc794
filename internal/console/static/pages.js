// pages.js: the schedules and concurrency keys pages, and the
// overview's throughput sparklines. Everything shown comes from the
// public API (api.js).
import { call, get } from "./api.js";
import { el, statusCell, taskLink, time, toast } from "./ui.js";

/** schedulePath is a schedule's route, naming its customer (an operator
 * acts on any customer's; a customer token may name only its own). */
const schedulePath = (s, sub = "") =>
  "/v1/schedules/" + encodeURIComponent(s.id) + (sub ? "/" + sub : "") + "?customerId=" + encodeURIComponent(s.customerId);

/** pager is a toolbar of First page / Next page buttons over a cursor
 * list; load(after) reads a page and answers its next cursor. */
function pager(load) {
  const cursors = [""];
  let next = "";
  const nextBtn = el("button", { type: "button", class: "next-page", disabled: true, onclick: () => { cursors.push(next); run(); } }, "Next page");
  const firstBtn = el("button", { type: "button", class: "first-page", disabled: true, onclick: () => { cursors.length = 1; run(); } }, "First page");
  async function run() {
    next = (await load(cursors.at(-1))) || "";
    nextBtn.disabled = !next;
    firstBtn.disabled = cursors.length === 1;
  }
  return { buttons: [firstBtn, nextBtn], run };
}

/** schedulesPage lists the live schedules: timing, state, next instants,
 * recent runs (each linking to its task, with its status) and the
 * pause/resume, trigger and delete actions. */
export function schedulesPage(main) {
  const tbody = el("tbody");
  const pages = pager(async (after) => {
    const q = new URLSearchParams({ limit: "50" });
    if (after) q.set("after", after);
    const list = await get("/v1/schedules?" + q);
    // A redraw keeps the keyboard focus on its row's action (the first
    // one when it changed: Pause became Resume).
    const focused = document.activeElement;
    const was = tbody.contains(focused) ? focused.closest("tr") : null;
    tbody.replaceChildren(...list.schedules.map(row));
    if (!list.schedules.length) tbody.append(el("tr", {}, el("td", { colSpan: 7, class: "muted" }, "No schedules.")));
    if (was) {
      const now = [...tbody.rows].find((r) => r.dataset.schedule === was.dataset.schedule && r.dataset.customer === was.dataset.customer);
      (now?.querySelector(`button[data-action="${focused.dataset.action}"]`) || now?.querySelector("button"))?.focus();
    }
    return list.next;
  });
  main.replaceChildren(el("h1", {}, "Schedules"), el("div", { class: "toolbar" }, pages.buttons),
    el("table", { id: "schedules", class: "wrap", "aria-label": "schedules" },
      el("thead", {}, el("tr", {}, ["customer", "id", "timing", "state", "next instants", "recent runs", "actions"].map((h) => el("th", { scope: "col" }, h)))),
      tbody));

  function row(s) {
    const act = (label, method, sub, done) => el("button", {
      type: "button", "data-action": sub || "delete", "aria-label": label.toLowerCase() + " schedule " + s.id, class: method === "DELETE" ? "danger" : "",
      onclick: async () => {
        if (method === "DELETE" && !confirm(`Delete schedule ${s.id}? Its history is kept; it fires no more.`)) return;
        try {
          const out = await call(method, schedulePath(s, sub), method === "POST" ? {} : undefined);
          toast(done(out));
        } catch (e) { toast(e.message); }
        await pages.run();
      },
    }, label);
    return el("tr", { "data-schedule": s.id, "data-customer": s.customerId, "data-paused": String(s.paused) },
      el("td", {}, s.customerId),
      el("td", { class: "mono" }, s.id),
      el("td", { class: "mono" }, s.cron ? s.cron + " " + s.timezone : "every " + s.every),
      el("td", { "data-role": "state" }, s.paused ? "paused" : "active"),
      el("td", {}, s.next.length ? el("ul", { class: "plain" }, s.next.map((t) => el("li", {}, time(t)))) : el("span", { class: "muted" }, "none")),
      el("td", {}, s.runs.length ? el("ul", { class: "plain" }, s.runs.slice(0, 5).map((r) => el("li", { "data-task": r.taskId || "" },
        time(r.at), " ",
        r.taskId ? [r.status ? statusCell(r.status) : el("span", { class: "muted" }, "not seen yet"), " ", taskLink(r.taskId)] : el("span", { class: "muted" }, "skipped (" + r.skipped + ")"),
        r.manual ? " · trigger" : "", r.missed ? ` · ${r.missed} missed` : ""))) : el("span", { class: "muted" }, "none yet")),
      el("td", { class: "actions" },
        s.paused ? act("Resume", "POST", "resume", () => "resumed " + s.id) : act("Pause", "POST", "pause", () => "paused " + s.id),
        act("Trigger", "POST", "trigger", (t) => "triggered " + s.id + ": task " + t.id),
        act("Delete", "DELETE", "", () => "deleted " + s.id)));
  }
  return { refresh: () => pages.run(), stop() {} };
}

// The most keys whose holders and waiters the concurrency page reads
// (one GET /v1/concurrency each), and the waiters it lists per key.
const MAX_KEY_DETAILS = 50;
const MAX_WAITERS_SHOWN = 20;

/** concurrencyPage lists the concurrency keys with a task holding or
 * waiting for a slot (GET /v1/stats), each with its limit, its holders
 * and its waiters linking to their tasks (GET /v1/concurrency). */
export function concurrencyPage(main) {
  const body = el("div", { "data-page": "concurrency" }, el("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(el("h1", {}, "Concurrency keys"), body);
  const slot = (role) => (k) => el("li", { "data-role": role, "data-task": k.taskId }, k.status ? statusCell(k.status) : "", " ", taskLink(k.taskId));
  async function refresh() {
    const stats = await get("/v1/stats");
    const keys = stats.keys.slice(0, MAX_KEY_DETAILS);
    const details = await Promise.all(keys.map((k) => get("/v1/concurrency?" + new URLSearchParams({ customerId: k.customerId, key: k.key }))));
    const rows = keys.map((k, i) => {
      const d = details[i];
      const more = d.waiters.length - MAX_WAITERS_SHOWN;
      return el("tr", { "data-key": k.key, "data-customer": k.customerId },
        el("td", {}, k.customerId), el("td", { class: "mono" }, k.key), el("td", { class: "num" }, String(k.limit)),
        el("td", {}, el("b", { "data-count": "holders" }, String(d.holders.length)), el("ul", { class: "plain" }, d.holders.map(slot("holder")))),
        el("td", {}, el("b", { "data-count": "waiters" }, String(d.waiters.length)),
          el("ul", { class: "plain" }, d.waiters.slice(0, MAX_WAITERS_SHOWN).map(slot("waiter"))),
          more > 0 ? el("span", { class: "muted" }, `and ${more} more`) : null,
          k.waiting > d.waiters.length ? el("div", { class: "muted" }, `${k.waiting - d.waiters.length} more not due yet`) : null));
    });
    const omitted = stats.keys.length - keys.length;
    body.replaceChildren(...[
      stats.keys.length ? el("table", { id: "keys", class: "wrap", "aria-label": "concurrency keys" },
        el("thead", {}, el("tr", {}, ["customer", "key", "limit", "holders", "waiters (due)"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows)) : el("p", { class: "muted" }, "No task holds or waits for a concurrency slot."),
      omitted > 0 || stats.keysTruncated ? el("p", { class: "muted" }, `${omitted}${stats.keysTruncated ? "+" : ""} more keys not shown.`) : null].filter(Boolean));
  }
  return { refresh, stop() {} };
}

// The throughput ring: one sample at most every SAMPLE_MS, the last RING
// of them (five minutes), kept while the tab is open.
const SAMPLE_MS = 5000;
const RING = 60;
const samples = [];

/** sampleThroughput adds a GET /v1/stats answer's claims and results
 * per second (last minute, summed over its rows) to the ring, unless
 * the last sample is younger than SAMPLE_MS; it answers the ring. */
export function sampleThroughput(stats) {
  const at = Date.parse(stats.at);
  if (!samples.length || at - samples.at(-1).at >= SAMPLE_MS) {
    const sum = (key) => stats.queues.reduce((n, r) => n + r[key].last1m, 0);
    samples.push({ at, claims: sum("claims"), results: sum("results") });
    if (samples.length > RING) samples.shift();
  }
  return samples;
}

/** sparkline draws values (oldest first) as an SVG line, scaled to
 * their largest; label names it for assistive technology. */
export function sparkline(values, label) {
  const NS = "http://www.w3.org/2000/svg";
  const w = 160, h = 32;
  const svg = document.createElementNS(NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: "img", "aria-label": label, class: "spark" })) svg.setAttribute(k, v);
  if (values.length === 1) values = [values[0], values[0]]; // a level line
  const top = Math.max(...values, 0.01);
  const x = (i) => (values.length < 2 ? w : (i * w) / (values.length - 1));
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", values.map((v, i) => `${x(i).toFixed(1)},${(h - 2 - (v / top) * (h - 4)).toFixed(1)}`).join(" "));
  svg.append(line);
  return svg;
}
