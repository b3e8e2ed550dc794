// app.js: the console's pages (overview, tasks, task), routed by the URL
// hash; pages.js holds the schedules and concurrency pages. Everything
// shown comes from the public API (api.js).
import { ApiError, Live, call, features, followRun, get, post, taskPath, token } from "./api.js";
import { concurrencyPage, sampleThroughput, schedulesPage, sparkline } from "./pages.js";
import { ago, copyButton, el, statusCell, taskLink, time, toast } from "./ui.js";

const TERMINAL = new Set(["succeeded", "failed", "canceled", "timed_out"]);
const STATUSES = ["scheduled", "queued", "running", "succeeded", "failed", "canceled", "timed_out"];
const main = document.getElementById("main");
let feats = null;
let live = null;
let page = null; // the current page: {refresh(ev), stop()}

function duration(task) {
  if (!task.startedAt) return "";
  const ms = (task.completedAt ? Date.parse(task.completedAt) : Date.now()) - Date.parse(task.startedAt);
  return ms < 1000 ? ms + "ms" : ms < 120000 ? (ms / 1000).toFixed(1) + "s" : Math.round(ms / 60000) + "m";
}

const firstLine = (task) => (((task.message || {}).content || [])[0]?.text || "").split("\n")[0];
const labels = (task) => Object.entries(task.labels || {}).map(([k, v]) => k + "=" + v).join(" ");
/** jsonBlock shows a payload or an output as indented JSON, as text (never
 * HTML), in a <pre> with id; null for none. */
const jsonBlock = (id, v) => (v === undefined || v === null ? null : el("pre", { id, class: "json" }, JSON.stringify(v, null, 2)));

// ---- login ----

function loginPage(message) {
  const input = el("input", { type: "password", id: "token", autocomplete: "current-password", required: true });
  const form = el("form", {
    class: "login",
    onsubmit: async (e) => {
      e.preventDefault();
      token.set(input.value.trim());
      start();
    },
  },
  el("h1", {}, "Log in"),
  el("p", { class: "muted" }, "Paste a bearer token of the server's --auth-file. It stays in this tab (session storage) only."),
  message ? el("p", { role: "alert" }, message) : null,
  el("label", { for: "token" }, "Token"), input,
  el("button", { type: "submit" }, "Log in"));
  main.replaceChildren(form);
  input.focus();
}

// ---- overview ----

function overviewPage() {
  const body = el("div", { "data-page": "overview" }, el("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(el("h1", {}, "Overview"), body);
  const link = (q, text) => el("a", { href: "#/tasks?" + new URLSearchParams(q) }, String(text));
  async function refresh() {
    // One page of up to 1000 tasks (the projections' live and retained
    // tasks) for the last hour's failures, and for the queue counts when
    // the server has no GET /v1/stats.
    const [list, stats] = await Promise.all([get("/v1/tasks?limit=1000"), feats.stats ? get("/v1/stats") : null]);
    const now = Date.now();
    const lastHour = (status) => list.tasks.filter((t) => t.status === status && t.completedAt && now - Date.parse(t.completedAt) < 3600e3).length;
    const rows = stats ? stats.queues : queueRows(list.tasks);
    const oldest = rows.reduce((a, r) => (r.oldestQueuedSeconds > (a?.oldestQueuedSeconds || 0) ? r : a), null);
    const card = (stat, value, label, ...extra) => el("div", { class: "card", "data-stat": stat }, el("b", {}, value), label, extra);
    const ring = stats ? sampleThroughput(stats) : [];
    const spark = (key, label) => sparkline(ring.map((s) => s[key]), `${label} over the last ${ring.length} samples, ${ring.length ? Math.max(...ring.map((s) => s[key])).toFixed(2) : 0} at most`);
    const late = stats?.alarm?.lateness;
    const keys = stats?.keys || [];
    const cards = el("div", { class: "cards" },
      card("failed", link({ status: "failed" }, lastHour("failed")), "failed in the last hour"),
      card("timed_out", link({ status: "timed_out" }, lastHour("timed_out")), "timed out in the last hour"),
      card("oldest", oldest ? link({ status: "queued", queue: oldest.queue, customerId: oldest.customerId }, seconds(oldest.oldestQueuedSeconds)) : "—", "oldest queued"),
      stats ? card("claims", rate(rows, "claims"), "claims/s, last minute", spark("claims", "claims per second")) : null,
      stats ? card("results", rate(rows, "results"), "results/s, last minute", spark("results", "results per second")) : null,
      stats?.lag !== undefined ? card("lag", String(stats.lag), "projection lag (events)") : null, // the operator's alone
      late ? card("lateness", late.samples ? millis(late.p99Seconds) : "—", "alarm lateness p99, 5 min",
        el("div", { class: "muted" }, late.samples ? `p50 ${millis(late.p50Seconds)} · max ${millis(late.maxSeconds)} · ${late.samples} actions` : "no timer fired")) : null,
      stats ? card("rejections", String(rows.reduce((n, r) => n + (r.rejections || 0), 0)), "admission rejections") : null,
      feats.concurrency ? card("keys", el("a", { href: "#/concurrency" }, String(keys.length)), "busy concurrency keys",
        el("div", { class: "muted" }, `${keys.reduce((n, k) => n + k.holders, 0)} holding · ${keys.reduce((n, k) => n + k.waiting, 0)} waiting`)) : null,
      feats.schedules && stats?.schedules ? card("schedules", el("a", { href: "#/schedules" }, String(stats.schedules.length)), "live schedules",
        el("div", { class: "muted" }, `${stats.schedules.filter((s) => s.paused).length} paused`)) : null);
    const extra = stats ? ["claims/s 1m", "results/s 1m", "near timeout", "retries", "rejections"] : [];
    const table = el("table", { class: "counts", "aria-label": "tasks by queue and status" },
      el("thead", {}, el("tr", {}, el("th", {}, "customer"), el("th", {}, "queue"), STATUSES.map((s) => el("th", { class: "num" }, s)), extra.map((h) => el("th", { class: "num" }, h)))),
      el("tbody", {}, rows.map((r) => {
        const q = { customerId: r.customerId, queue: r.queue };
        return el("tr", { "data-queue": r.queue },
          el("td", {}, link({ customerId: r.customerId }, r.customerId)), el("td", {}, link(q, r.queue)),
          STATUSES.map((s) => el("td", { class: "num" }, r.counts[s] ? link({ ...q, status: s }, r.counts[s]) : "0")),
          stats ? [r.claims.last1m.toFixed(2), r.results.last1m.toFixed(2), r.nearTimeout, r.retries, r.rejections].map((v) => el("td", { class: "num" }, String(v))) : null);
      })));
    body.replaceChildren(cards, el("h2", {}, "Queues"), rows.length ? table : el("p", { class: "muted" }, "No tasks yet."),
      ...(stats?.epochs ? epochsTable(stats.epochs) : []));
  }
  // The stream reloads the page on events; the timer samples the
  // throughput while nothing happens.
  const timer = feats.stats ? setInterval(() => onLive(null), 5000) : null;
  return { refresh, stop() { clearInterval(timer); } };
}

/** epochsTable shows a log's epoch slots (GET /v1/stats' epochs): which
 * epoch each holds, its period and state, and the epochs removed. */
function epochsTable(e) {
  const time = (t) => (t ? new Date(t).toISOString().replace(".000Z", "Z") : "—");
  return [el("h2", {}, "Epochs"),
    el("table", { id: "epochs", "aria-label": "epoch slots" },
      el("thead", {}, el("tr", {}, ["slot", "epoch", "state", "period", "opened", "sealed"].map((h) => el("th", {}, h)))),
      el("tbody", {}, e.slots.map((s) => el("tr", { "data-slot": String(s.slot), "data-state": s.state },
        el("td", {}, String(s.slot)), el("td", {}, s.epoch === undefined ? "—" : String(s.epoch)),
        el("td", {}, s.state + (s.slot === e.current ? " (current)" : "")),
        el("td", {}, s.start ? `${time(s.start)} – ${time(s.end)}` : "—"), el("td", {}, time(s.opened)), el("td", {}, time(s.sealed)))))),
    el("p", { class: "muted" }, `Period ${seconds(e.periodSeconds)}. ` + (e.removed.length ? `Removed epochs: ${e.removed.join(", ")}.` : "No epoch removed yet."))];
}

/** queueRows counts tasks per customer and queue, in the shape of
 * GET /v1/stats' rows, for a server without that route. */
function queueRows(tasks) {
  const rows = new Map();
  for (const t of tasks) {
    const key = t.customerId + "/" + t.queue;
    const r = rows.get(key) || { customerId: t.customerId, queue: t.queue, counts: {}, oldestQueuedSeconds: 0 };
    r.counts[t.status] = (r.counts[t.status] || 0) + 1;
    if (t.status === "queued") r.oldestQueuedSeconds = Math.max(r.oldestQueuedSeconds, (Date.now() - Date.parse(t.createdAt)) / 1000);
    rows.set(key, r);
  }
  return [...rows.values()].sort((a, b) => (a.customerId + "/" + a.queue < b.customerId + "/" + b.queue ? -1 : 1));
}

const seconds = (s) => (s < 90 ? Math.round(s) + "s" : s < 5400 ? Math.round(s / 60) + "m" : Math.round(s / 3600) + "h");
const millis = (s) => (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
const rate = (rows, key) => rows.reduce((n, r) => n + r[key].last1m, 0).toFixed(2);

// ---- tasks ----

function tasksPage(query) {
  const selected = new Set();
  let rows = [];
  const cursors = [query.get("after") || ""];
  const params = feats.listParams.filter((p) => p.name !== "limit" && p.name !== "after");
  const inputs = {};
  const filters = el("form", {
    class: "filters", role: "search",
    onsubmit: (e) => {
      e.preventDefault();
      const q = new URLSearchParams();
      // A parameter that repeats (label) takes several values, space separated.
      for (const p of params) for (const v of p.many ? inputs[p.name].value.split(/\s+/) : [inputs[p.name].value]) if (v) q.append(p.name, v);
      location.hash = "#/tasks?" + q;
    },
  }, params.map((p) => {
    const id = "f-" + p.name;
    const input = p.enum
      ? el("select", { id, name: p.name }, el("option", { value: "" }, "any"), p.enum.map((v) => el("option", { value: v }, v)))
      : p.name === "idPrefix"
        ? el("input", { id, name: p.name, type: "search", size: 28, maxLength: 64, pattern: "[A-Za-z0-9_\\-]+", placeholder: "id starts with…", title: "letters, digits, _ and -" })
        : el("input", { id, name: p.name, size: 14, placeholder: p.format === "date-time" ? "RFC 3339" : p.many ? "key=value …" : "" });
    input.value = query.getAll(p.name).join(" ");
    inputs[p.name] = input;
    return el("label", { for: id }, p.name, input);
  }), el("button", { type: "submit" }, "Filter"), el("a", { href: "#/tasks" }, "clear"));
  const info = el("span", { class: "muted", "data-role": "paused" });
  const cancelBtn = el("button", { type: "button", class: "danger", id: "bulk-cancel", disabled: true, onclick: () => bulk("cancel") }, "Cancel selected");
  const retryBtn = feats.retry ? el("button", { type: "button", id: "bulk-retry", disabled: true, onclick: () => bulk("retry") }, "Retry selected") : null;
  const nextBtn = el("button", { type: "button", id: "next-page", disabled: true, onclick: () => { cursors.push(nextCursor); load(); } }, "Next page");
  const firstBtn = el("button", { type: "button", id: "first-page", disabled: true, onclick: () => { cursors.length = 1; cursors[0] = ""; load(); } }, "First page");
  const tbody = el("tbody");
  const all = el("input", { type: "checkbox", "aria-label": "select all", onchange: () => { for (const t of rows) all.checked ? selected.add(t.id) : selected.delete(t.id); render(); } });
  const table = el("table", { id: "tasks", "aria-label": "tasks" },
    el("thead", {}, el("tr", {}, el("th", {}, all), ["status", "id", "queue", "kind", "customer", "labels", "created", "started", "duration", "attempt", "message"].map((h) => el("th", { scope: "col" }, h)))),
    tbody);
  main.replaceChildren(el("h1", {}, "Tasks"), filters, el("div", { class: "toolbar" }, cancelBtn, retryBtn, firstBtn, nextBtn, info), table);
  let nextCursor = "";

  function render() {
    tbody.replaceChildren(...rows.map((t) => el("tr", { "data-id": t.id, class: selected.has(t.id) ? "selected" : "" },
      el("td", {}, el("input", {
        type: "checkbox", checked: selected.has(t.id), "aria-label": "select " + t.id,
        onchange: (e) => { e.target.checked ? selected.add(t.id) : selected.delete(t.id); render(); },
      })),
      el("td", {}, statusCell(t.status)),
      el("td", { class: "id" }, taskLink(t.id), copyButton(t.id)),
      el("td", {}, t.queue), el("td", { class: "mono", "data-role": "kind" }, t.kind || ""), el("td", {}, t.customerId), el("td", {}, labels(t)),
      el("td", {}, time(t.createdAt)), el("td", {}, time(t.startedAt)), el("td", { class: "num" }, duration(t)),
      el("td", { class: "num" }, t.delivery?.attempt ?? ""), el("td", { title: firstLine(t) }, firstLine(t)))));
    if (!rows.length) tbody.append(el("tr", {}, el("td", { colSpan: 12, class: "muted" }, "No tasks match.")));
    cancelBtn.disabled = selected.size === 0;
    if (retryBtn) retryBtn.disabled = selected.size === 0;
    info.textContent = selected.size ? `live updates paused: ${selected.size} selected` : "";
    all.checked = rows.length > 0 && rows.every((t) => selected.has(t.id));
  }

  async function load() {
    const q = new URLSearchParams();
    for (const p of params) for (const v of query.getAll(p.name)) if (v) q.append(p.name, v);
    q.set("limit", "100");
    if (cursors.at(-1)) q.set("after", cursors.at(-1));
    const list = await get("/v1/tasks?" + q);
    rows = list.tasks;
    nextCursor = list.next || "";
    nextBtn.disabled = !nextCursor;
    firstBtn.disabled = cursors.length === 1 && !cursors[0];
    render();
  }

  async function bulk(action) {
    const ids = [...selected];
    const failed = [];
    for (const id of ids) {
      try {
        await post(taskPath(id, action), action === "cancel" ? { reason: "canceled from the console" } : {});
      } catch (e) { failed.push(id + ": " + e.message); }
    }
    selected.clear();
    toast(failed.length ? `${action}: ${ids.length - failed.length} done, failed ${failed.join("; ")}` : `${action}: ${ids.length} done`);
    await load();
  }

  return { refresh: () => (selected.size ? Promise.resolve() : load()), stop() {} };
}

// ---- task ----

function taskPage(id) {
  const open = new Set(); // timeline entries expanded, kept across reloads
  const header = el("section", { "aria-label": "task" });
  const timeline = el("ol", { class: "timeline", id: "timeline" });
  const tree = el("div", { id: "tree" });
  const mail = el("ol", { id: "mailbox" });
  const run = el("div", { id: "run" });
  // What the run sends live: its saves and progress lines (model
  // tokens), as text, the last MAX_LIVE characters.
  const MAX_LIVE = 16384;
  const liveOut = el("pre", { id: "run-live", class: "live-output", "aria-live": "polite" });
  const liveState = el("p", { id: "run-live-state", class: "muted" }, "");
  const outcome = el("div", { id: "outcome" });
  let events = [];
  const text = el("textarea", { id: "mail-text", rows: 3, cols: 40, required: true });
  const mailForm = el("form", {
    id: "mail-form",
    onsubmit: async (e) => {
      e.preventDefault();
      try {
        const a = await post(taskPath(id, "mailbox"), { message: { content: [{ type: "text", text: text.value }] } });
        text.value = "";
        toast("message " + a.index + " posted");
        await refresh();
      } catch (err) { toast(err.message); }
    },
  }, el("label", { for: "mail-text" }, "Follow-up message"), el("br"), text, el("br"), el("button", { type: "submit" }, "Send message"));
  const download = el("button", {
    type: "button", onclick: () => {
      const blob = new Blob(events.map((ev) => JSON.stringify(ev) + "\n"), { type: "application/x-ndjson" });
      const a = el("a", { href: URL.createObjectURL(blob), download: id + ".ndjson" });
      a.click();
      URL.revokeObjectURL(a.href);
    },
  }, "Download NDJSON");
  main.replaceChildren(header, el("div", { class: "cols" },
    el("div", {}, el("h2", {}, "Timeline ", download), timeline),
    el("div", {}, el("h2", {}, "Lineage"), tree, el("h2", {}, "Outcome"), outcome, el("h2", {}, "Mailbox"), mail, mailForm, el("h2", {}, "Run"), run,
      el("h3", {}, "Live"), liveState, liveOut)));
  const appendLive = (line) => {
    liveOut.textContent = (liveOut.textContent + line).slice(-MAX_LIVE);
  };
  let follower = null;
  if (feats.runStream) {
    follower = followRun(id, {
      onSaved: (c) => {
        liveState.textContent = "following: revision " + c.revision;
        for (const it of c.transcript?.append || []) {
          appendLive(`[${it.kind}] ` + (it.content || []).map((p) => p.text || "").join(" ") + (it.tool ? ` ${it.tool.name} ${it.tool.status}` : "") + "\n");
        }
        if (c.set && "phase" in c.set) appendLive("[phase] " + String(c.set.phase ?? "") + "\n");
        refreshRun();
      },
      onProgress: (p) => appendLive(p.text),
      onEnd: (e) => { liveState.textContent = "ended: " + e.status; },
    });
  }
  const act = async (path, body, what) => {
    try { await post(path, body); toast(what); await refresh(); } catch (err) { toast(err.message); }
  };

  function renderHeader(t, crumbs) {
    const actions = [];
    if (!TERMINAL.has(t.status)) actions.push(el("button", { type: "button", class: "danger", id: "cancel", onclick: () => act(taskPath(id, "cancel"), { reason: "canceled from the console" }, "canceled") }, "Cancel"));
    if (feats.retry && TERMINAL.has(t.status)) {
      actions.push(el("button", {
        type: "button", id: "retry",
        onclick: async () => {
          try { const n = await post(taskPath(id, "retry"), {}); toast("retried as " + n.id); location.hash = "#/task/" + encodeURIComponent(n.id); } catch (err) { toast(err.message); }
        },
      }, "Retry as a new task"));
    }
    header.replaceChildren(
      el("nav", { class: "crumbs", "aria-label": "lineage" }, crumbs.map((c, i) => [i ? " › " : "", c === id ? el("span", { class: "mono" }, c) : taskLink(c)])),
      el("h1", {}, statusCell(t.status), " ", el("span", { class: "mono" }, t.id), copyButton(t.id)),
      el("div", { class: "toolbar" }, actions),
      el("dl", { class: "facts" },
        el("dt", {}, "customer"), el("dd", {}, t.customerId),
        el("dt", {}, "queue"), el("dd", {}, el("a", { href: "#/tasks?queue=" + encodeURIComponent(t.queue) }, t.queue)),
        t.requestId ? [el("dt", {}, "requestId"), el("dd", {}, t.requestId)] : null,
        t.labels ? [el("dt", {}, "labels"), el("dd", {}, labels(t))] : null,
        t.kind ? [el("dt", {}, "kind"), el("dd", { class: "mono" }, el("a", { href: "#/tasks?kind=" + encodeURIComponent(t.kind) }, t.kind))] : null,
        el("dt", {}, "message"), el("dd", {}, firstLine(t)),
        t.payload !== undefined ? [el("dt", {}, "payload"), el("dd", {}, jsonBlock("payload", t.payload))] : null,
        el("dt", {}, "created"), el("dd", {}, time(t.createdAt)),
        el("dt", {}, "run at"), el("dd", {}, time(t.runAt)),
        t.startedAt ? [el("dt", {}, "started"), el("dd", {}, time(t.startedAt), " (", duration(t), ")")] : null,
        t.completedAt ? [el("dt", {}, "completed"), el("dd", {}, time(t.completedAt))] : null,
        t.claim ? [el("dt", {}, "claim"), el("dd", { class: "mono" }, t.claim.executorId + " with " + t.claim.deliveryId)] : null,
        t.delivery ? [el("dt", {}, "delivery"), el("dd", { class: "mono" }, t.delivery.id + " attempt " + t.delivery.attempt)] : null,
        t.deadline ? [el("dt", {}, "deadline"), el("dd", {}, el("time", { dateTime: t.deadline, "data-countdown": t.deadline }, ago(t.deadline)))] : null,
        t.reason ? [el("dt", {}, "reason"), el("dd", { id: "reason" }, t.reason)] : null));
  }

  function renderTimeline() {
    timeline.replaceChildren(...events.map((ev) => {
      const details = el("details", { ontoggle: () => (details.open ? open.add(ev.id) : open.delete(ev.id)) },
        el("summary", {}, el("b", { "data-type": ev.type }, ev.type), " → ", statusCell(ev.status || "?"), " · ", time(ev.at), " · ", ev.actor || "",
          ev.data?.deliveryId ? el("span", { class: "mono" }, " · " + ev.data.deliveryId) : ""),
        el("pre", {}, JSON.stringify(ev, null, 2)));
      details.open = open.has(ev.id);
      return el("li", { "data-seq": ev.seq }, details, el("div", { class: "muted" }, ev.detail || ""));
    }));
  }

  function renderTree(node) {
    const ids = [];
    const walk = (n) => {
      ids.push(n.task.id);
      const live = [];
      const collect = (m) => { (m.children || []).forEach(collect); if (!TERMINAL.has(m.task.status)) live.push(m.task.id); };
      collect(n);
      return el("li", { "data-id": n.task.id },
        statusCell(n.task.status), " ", n.task.id === id ? el("b", { class: "mono" }, n.task.id) : taskLink(n.task.id), " ", el("span", { class: "muted" }, firstLine(n.task)),
        live.length ? el("button", {
          type: "button", class: "copy danger", "aria-label": "cancel subtree of " + n.task.id,
          onclick: async () => {
            for (const cid of live) { try { await post(taskPath(cid, "cancel"), { reason: "subtree canceled from the console" }); } catch (e) { if (!(e instanceof ApiError && e.status === 409)) toast(e.message); } }
            toast("canceled " + live.length); await refresh();
          },
        }, "cancel subtree") : null,
        n.children?.length ? el("ul", { class: "tree" }, n.children.map(walk)) : null);
    };
    tree.replaceChildren(el("ul", { class: "tree" }, walk(node)));
    return ids;
  }

  function crumbsOf(node) {
    const path = [];
    const find = (n, acc) => {
      const here = [...acc, n.task.id];
      if (n.task.id === id) { path.push(...here); return true; }
      return (n.children || []).some((c) => find(c, here));
    };
    find(node, []);
    return path;
  }

  function renderOutcome(t) {
    const parts = [];
    if (t.reason) parts.push(el("p", {}, el("b", {}, t.status === "canceled" && /^(quota|usage):/.test(t.reason) ? "admission rejected: " : "reason: "), t.reason));
    if (t.result) parts.push(el("dl", { class: "facts", id: "result" },
      el("dt", {}, "success"), el("dd", {}, String(t.result.success)),
      t.result.summary ? [el("dt", {}, "summary"), el("dd", {}, t.result.summary)] : null,
      t.result.error ? [el("dt", {}, "error"), el("dd", {}, t.result.error)] : null,
      t.result.output !== undefined ? [el("dt", {}, "output"), el("dd", {}, jsonBlock("output", t.result.output))] : null));
    const effects = t.effects || t.result?.effects || [];
    if (effects.length) parts.push(el("ul", { id: "effects" }, effects.map((e) => el("li", {},
      e.kind + " ", e.url && /^https?:/.test(e.url) ? el("a", { href: e.url, rel: "noreferrer noopener", target: "_blank" }, e.ref || e.url) : e.ref || "", e.uncertain ? " (uncertain)" : ""))));
    outcome.replaceChildren(...(parts.length ? parts : [el("p", { class: "muted" }, "No result yet.")]));
  }

  function renderMail(m, t) {
    mail.replaceChildren(...m.messages.map((msg) => el("li", { value: msg.index, "data-index": msg.index },
      time(msg.createdAt), msg.index <= m.cursor ? " (read) " : " (unread) ", (msg.content || []).map((c) => c.text).join(" "))));
    mailForm.hidden = TERMINAL.has(t.status);
  }

  function renderRun(r) {
    if (!r) { run.replaceChildren(el("p", { class: "muted" }, "No Run saved.")); return; }
    const doc = r.run || {};
    run.replaceChildren(el("dl", { class: "facts" },
      el("dt", {}, "phase"), el("dd", {}, doc.phase || ""),
      el("dt", {}, "turn"), el("dd", {}, doc.turn ?? 0),
      el("dt", {}, "revision"), el("dd", {}, r.revision),
      el("dt", {}, "updated"), el("dd", {}, time(r.updatedAt))),
    el("h3", {}, "Transcript"), el("ol", {}, (doc.transcript || []).map((it) => el("li", {}, el("b", {}, it.kind), ` (turn ${it.turn}) `,
      (it.content || []).map((c) => c.text).join(" "), it.tool ? ` ${it.tool.name} ${it.tool.status}` : ""))),
    el("h3", {}, "Pending tools"), el("ul", {}, (doc.pendingTools || []).map((p) => el("li", {}, `${p.name} (${p.status})`))),
    el("h3", {}, "Contexts"), el("pre", {}, JSON.stringify(doc.contexts || {}, null, 2)));
  }

  const getRun = () => get(taskPath(id, "run")).catch((e) => { if (e instanceof ApiError && e.status === 404) return null; throw e; });
  async function refreshRun() {
    try { renderRun(await getRun()); } catch (e) { toast(e.message); }
  }

  let lineage = new Set([id]);
  async function refresh(ev) {
    if (ev && !lineage.has(ev.taskId)) return;
    const [t, h, tr, m, r] = await Promise.all([
      get(taskPath(id)), get(taskPath(id, "history")), get(taskPath(id, "tree")), get(taskPath(id, "mailbox")),
      getRun(),
    ]);
    events = h.events;
    renderHeader(t, crumbsOf(tr));
    renderTimeline();
    lineage = new Set(renderTree(tr));
    renderOutcome(t);
    renderMail(m, t);
    renderRun(r);
  }
  return { refresh, stop() { follower?.stop(); } };
}

// ---- routing ----

/** decode is decodeURIComponent for text from the URL, which the user
 * may have typed or pasted: a malformed escape (a stray "%") is kept as
 * it is instead of throwing. */
function decode(s) {
  try { return decodeURIComponent(s); } catch { return s; }
}

async function route() {
  page?.stop();
  const [path, qs] = location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(qs || "");
  for (const a of document.querySelectorAll("nav a")) a.removeAttribute("aria-current");
  if (path.startsWith("/task/")) page = taskPage(decode(path.slice(6)));
  else if (path === "/tasks") page = tasksPage(query);
  else if (path === "/schedules" && feats.schedules) page = schedulesPage(main);
  else if (path === "/concurrency" && feats.concurrency) page = concurrencyPage(main);
  else page = overviewPage();
  const nav = path.startsWith("/task/") ? "/tasks" : ["/tasks", "/schedules", "/concurrency"].includes(path) ? path : "/";
  const current = document.querySelector(`nav a[href="#${nav}"]`);
  current?.setAttribute("aria-current", "page");
  await show(page.refresh());
}

async function show(p) {
  const shown = page; // a later route may replace it while p runs
  try { await p; } catch (e) {
    if (e instanceof ApiError && e.status === 401) { token.clear(); loginPage("That token is not known to the server."); return; }
    if (page !== shown) return; // the page that failed is gone: its error must not cover the current one
    main.replaceChildren(el("h1", {}, "Error"), el("p", { role: "alert" }, e.message));
  }
}

let refreshing = null, again = false;
/** onLive reloads the current page after an event: one reload at a time,
 * at most about three a second; events meanwhile make one more. */
function onLive(ev) {
  if (!page) return;
  if (refreshing) { again = true; return; }
  refreshing = show(page.refresh(ev))
    .then(() => new Promise((r) => setTimeout(r, 300)))
    .finally(() => { refreshing = null; if (again) { again = false; onLive(null); } });
}

async function start() {
  try {
    feats = feats || (await features());
    await get("/v1/tasks?limit=1");
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) { loginPage(token.get() ? "That token is not known to the server." : ""); token.clear(); return; }
    main.replaceChildren(el("h1", {}, "Cannot reach the server"), el("p", { role: "alert" }, e.message));
    return;
  }
  document.getElementById("logout").hidden = !token.get();
  document.getElementById("nav-schedules").hidden = !feats.schedules;
  document.getElementById("nav-concurrency").hidden = !feats.concurrency;
  if (!live) {
    const state = document.getElementById("live");
    live = new Live((s) => { state.textContent = s; state.dataset.state = s; });
    live.subscribe(onLive);
    live.start(feats.stream);
    window.addEventListener("hashchange", route);
  }
  await route();
}

document.getElementById("logout").addEventListener("click", () => { token.clear(); location.hash = "#/"; location.reload(); });
setInterval(() => {
  for (const t of document.querySelectorAll("[data-countdown]")) t.textContent = ago(t.dataset.countdown);
}, 1000);
start();
