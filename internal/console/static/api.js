// api.js: the console's only way to the server, the public HTTP API on
// the same origin. The token lives in sessionStorage and goes out as the
// Authorization header; a forged cross-site form cannot send it.

const TOKEN_KEY = "taskledger.token";

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || "",
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/** ApiError is a non-2xx answer: status, code, reason, message. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body.message || body.error || "HTTP " + status);
    this.status = status;
    this.code = body.error || "";
    this.reason = body.reason || "";
  }
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const t = token.get();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

/** call sends one request and answers the decoded JSON body (null for 204). */
export async function call(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(path, init);
  if (res.status === 204) return null;
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body ?? {});

/** task paths, with the id escaped. */
export const taskPath = (id, sub = "") => "/v1/tasks/" + encodeURIComponent(id) + (sub ? "/" + sub : "");

let spec = null;

/** features reads the OpenAPI document once and says what this server
 * offers, so pages appear when the API has them: the list route's query
 * parameters, and which optional routes exist. */
export async function features() {
  if (!spec) spec = await get("/v1/openapi.json");
  const paths = spec.paths || {};
  const params = ((paths["/v1/tasks"] || {}).get || {}).parameters || [];
  // "#/components/<kind>/<name>" → the component; anything else as it is.
  const resolve = (o) => (o && o.$ref ? o.$ref.split("/").slice(1).reduce((v, k) => (v || {})[k], spec) || {} : o || {});
  return {
    listParams: params.map(resolve).map((p) => {
      const schema = resolve(p.schema);
      const item = schema.type === "array" ? resolve(schema.items) : schema;
      return { name: p.name, many: schema.type === "array", enum: item.enum, format: item.format };
    }),
    stats: !!(paths["/v1/stats"] || {}).get,
    stream: !!(paths["/v1/events/stream"] || {}).get,
    runStream: !!(paths["/v1/tasks/{id}/run/stream"] || {}).get,
    retry: !!(paths["/v1/tasks/{id}/retry"] || {}).post,
    schedules: !!(paths["/v1/schedules"] || {}).get,
    // The keys come from GET /v1/stats, their tasks from GET /v1/concurrency.
    concurrency: !!(paths["/v1/concurrency"] || {}).get && !!(paths["/v1/stats"] || {}).get,
  };
}

/** readSSE reads Server-Sent Events from reader until it ends, calling
 * fn(id, type, data) for each message (comments skipped). */
async function readSSE(reader, fn) {
  const dec = new TextDecoder();
  let buf = "";
  let id = "", type = "", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (id || type || data.length) fn(id, type, data.join("\n"));
        id = ""; type = ""; data = [];
      } else if (line.startsWith("id:")) id = line.slice(3).trim();
      else if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

/** followRun follows task id's Run stream (GET /v1/tasks/{id}/run/stream)
 * until stop() is called or the task ends: onSaved(change) for each
 * revision after the latest seen, onProgress({text, at}) for each
 * progress line, onEnd({status}) once. A dropped connection is resumed
 * after the last revision seen (Last-Event-ID). */
export function followRun(id, { onSaved, onProgress, onEnd }) {
  const abort = new AbortController();
  let last = "", ended = false;
  (async () => {
    while (!ended && !abort.signal.aborted) {
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (last) h["Last-Event-ID"] = last;
        const res = await fetch(taskPath(id, "run/stream"), { headers: h, signal: abort.signal });
        if (!res.ok) return; // no such task for this token, or no stream here
        await readSSE(res.body.getReader(), (mid, type, data) => {
          let msg = null;
          try { msg = JSON.parse(data); } catch { return; }
          if (type === "saved") { last = mid; onSaved(msg); }
          else if (type === "progress") onProgress(msg);
          else if (type === "end") { ended = true; onEnd(msg); }
        });
      } catch {
        // fall through to reconnect
      }
      if (!ended && !abort.signal.aborted) await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return { stop: () => abort.abort() };
}

/** Live delivers every event the caller may see to its listener, from
 * the SSE stream when the server has one (resuming after the last seen
 * sequence, so a reconnect shows no gap and no duplicate), else a tick
 * every second (the listener then gets null and reloads what it shows). */
export class Live {
  constructor(onState) {
    this.listeners = new Set();
    this.onState = onState;
    this.lastSeq = 0;
    this.lastID = ""; // the resume token: lastSeq, a sharded log's "41-17-30", or a customer's opaque one
    this.abort = null;
  }
  subscribe(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); }
  emit(ev) { for (const fn of this.listeners) fn(ev); }

  start(stream) {
    if (!stream) {
      this.onState("polling");
      setInterval(() => this.emit(null), 1000);
      return;
    }
    this.connect();
  }

  async connect() {
    for (;;) {
      this.abort = new AbortController();
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (this.lastID) h["Last-Event-ID"] = this.lastID;
        const res = await fetch("/v1/events/stream", { headers: h, signal: this.abort.signal });
        if (!res.ok) throw new Error("stream: HTTP " + res.status);
        this.onState("live");
        this.emit(null); // reload: a first connect starts with the next event
        await this.read(res.body.getReader());
      } catch (e) {
        // fall through to reconnect
      }
      this.onState("reconnecting");
      await new Promise((r) => setTimeout(r, 1000));
    }
  }

  async read(reader) {
    // An overflow ends the stream; the reconnect resumes after lastID.
    await readSSE(reader, (id, type, data) => { if (type !== "overflow") this.dispatch(id, data); });
  }

  /** dispatch hands one message to the listeners, unless its id is one
   * already seen. On a sharded log the id is a token of one sequence a
   * shard, and for a customer token an opaque token, which a reconnect
   * resumes from exactly. */
  dispatch(id, data) {
    if (/^[0-9]+$/.test(id)) {
      const seq = Number(id);
      if (seq <= this.lastSeq) return; // seen already
      this.lastSeq = seq;
    }
    if (id !== "") this.lastID = id;
    if (!data) return;
    let ev = null;
    try { ev = JSON.parse(data); } catch { return; }
    // For other scripts on the page (and the browser tests): every event
    // of the stream, once, in order.
    window.dispatchEvent(new CustomEvent("taskledger:event", { detail: ev }));
    this.emit(ev);
  }
}
