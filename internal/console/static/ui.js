// ui.js: the small DOM helpers every page uses. Text is always set as
// text, never parsed as HTML.

/** el builds an element: attrs are properties (on* are listeners), the
 * rest are children (strings become text, never HTML). */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "for") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat(Infinity)) if (c !== undefined && c !== null && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}

export function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove("show"), 5000);
}

export const dot = (status) => el("span", { class: "dot s-" + status, "aria-hidden": "true" });
export const statusCell = (status) => el("span", { class: "status", "data-status": status }, dot(status), status);
export const taskLink = (id) => el("a", { href: "#/task/" + encodeURIComponent(id), class: "mono" }, id);

export function copyButton(text) {
  return el("button", {
    type: "button", class: "copy", title: "copy " + text, "aria-label": "copy id",
    onclick: (e) => { e.stopPropagation(); navigator.clipboard?.writeText(text).then(() => toast("copied " + text), () => toast(text)); },
  }, "copy");
}

export function ago(t) {
  if (!t) return "";
  const s = Math.round((Date.now() - Date.parse(t)) / 1000);
  const abs = Math.abs(s);
  const v = abs < 90 ? abs + "s" : abs < 5400 ? Math.round(abs / 60) + "m" : abs < 172800 ? Math.round(abs / 3600) + "h" : Math.round(abs / 86400) + "d";
  return s >= 0 ? v + " ago" : "in " + v;
}
export const time = (t) => (t ? el("time", { dateTime: t, title: t }, ago(t)) : "");
