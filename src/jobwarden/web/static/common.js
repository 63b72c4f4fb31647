// jobwarden web: helpers shared by the pages. Every job-provided string reaches the page as a text node
// (el() never parses HTML), so a log line or a command line can never become markup.
"use strict";

const jw = {
  async get(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(await jw.problem(r));
    return r.json();
  },

  // A change of a job: POST with the header no cross-origin form can send (the server checks it).
  async post(path, body) {
    const r = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-Jobwarden": "1", "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    });
    if (!r.ok) throw new Error(await jw.problem(r));
    return r.json();
  },

  async problem(r) {
    try {
      const j = await r.json();
      return `${r.status}: ${j.error}${j.remedy ? ` (${j.remedy})` : ""}`;
    } catch (e) {
      return `${r.status} ${r.statusText}`;
    }
  },

  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  },

  bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
  },

  percent(n) {
    return n === null || n === undefined ? "" : `${n.toFixed(1)} %`;
  },

  time(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return d.toLocaleString(undefined, { hour12: false });
  },

  stateBadge(state) {
    return jw.el("span", { class: `state state-${state}` }, state);
  },

  showError(message) {
    const p = document.getElementById("error");
    p.textContent = message || "";
    p.hidden = !message;
  },

  stamp() {
    const u = document.getElementById("updated");
    if (u) u.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
  },
};
