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

  // One time zone everywhere: the browser's local time, 24-hour, its offset said once per page
  // ("2026-11-25 14:02:07", the zone in the header by jw.zone()).
  time(iso) {
    if (!iso) return "";
    return jw.stamp24(new Date(iso).getTime() / 1000, true);
  },

  pad(n) { return String(n).padStart(2, "0"); },

  // seconds since 1970 as local "YYYY-MM-DD HH:MM:SS" (date: with the date)
  stamp24(t, date) {
    const d = new Date(t * 1000);
    const clock = `${jw.pad(d.getHours())}:${jw.pad(d.getMinutes())}:${jw.pad(d.getSeconds())}`;
    return date ? `${d.getFullYear()}-${jw.pad(d.getMonth() + 1)}-${jw.pad(d.getDate())} ${clock}` : clock;
  },

  // "UTC+01:00": the offset of the local time the page shows
  zone(t) {
    const off = -new Date((t || Date.now() / 1000) * 1000).getTimezoneOffset();
    const a = Math.abs(off);
    return `UTC${off < 0 ? "−" : "+"}${jw.pad(Math.floor(a / 60))}:${jw.pad(a % 60)}`;
  },

  // "3m ago", "2h ago": how long since an ISO time
  ago(iso) {
    if (!iso) return "";
    return `${jw.duration(Date.now() / 1000 - new Date(iso).getTime() / 1000)} ago`;
  },

  // how long a run ran (to now while it runs)
  runtime(started, ended) {
    if (!started) return "";
    const end = ended ? new Date(ended).getTime() : Date.now();
    return jw.duration((end - new Date(started).getTime()) / 1000);
  },

  stateBadge(state) {
    return jw.el("span", { class: `state state-${state}` }, state);
  },

  // --- progress (the same words as `jobwarden ps` and `status`: text/progress.py) ---------------------

  duration(seconds) {
    let s = Math.max(0, Math.floor(seconds));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    s %= 60;
    if (d) return `${d}d${h}h`;
    if (h) return `${h}h${String(m).padStart(2, "0")}m`;
    if (m) return `${m}m${String(s).padStart(2, "0")}s`;
    return `${s}s`;
  },

  figure(v) {
    return v >= 100 ? v.toFixed(0) : String(Number(v.toPrecision(3))); // 5.4, 5.43, 54.3, 543
  },

  unit(p) {
    const u = (p.unit || "it").slice(0, 12);
    return { iteration: "it", iterations: "it", update: "upd" }[u] || u;
  },

  rate(p) {
    if (!p.rate || p.rate <= 0) return "";
    return p.rate < 1 ? `${jw.figure(1 / p.rate)}s/${jw.unit(p)}` : `${jw.figure(p.rate)}${jw.unit(p)}/s`;
  },

  // the bar finished, and with it the run (a bar per epoch finishes each epoch: the run's fraction says)
  finished(p) {
    const bar = p.closed || (p.total !== null && p.step !== null && p.step >= p.total);
    return bar && (p.fraction === null || p.fraction >= 1 || !p.epoch || !p.epoch.total);
  },

  // "ep 2/3", "ep 2" (of an unknown number), as the CLI writes it
  epoch(p) {
    if (!p.epoch) return "";
    return p.epoch.total ? `ep ${p.epoch.n}/${p.epoch.total}` : `ep ${p.epoch.n}`;
  },

  // as text/progress.py's whole_percent and tqdm's own bar: half to even (8.5 -> 8, 82.8 -> 83), and 100
  // only at the end: one figure on the page and in the CLI
  wholePercent(fraction) {
    const share = (fraction || 0) * 100;
    if (share >= 100) return Math.floor(share);
    let whole = Math.round(share);
    if (Math.abs(share - Math.trunc(share)) === 0.5 && whole % 2 !== 0) whole -= 1;
    return Math.min(whole, 99);
  },

  // "45% 450/1000", "ep 2/3 83% 106/128": the percentage is the bar's, the ETA the run's
  counter(p) {
    if (p.step === null) return jw.epoch(p);
    const counter = p.total ? `${jw.wholePercent(Math.min(p.step / p.total, 1))}% ${p.step}/${p.total}` : `step ${p.step}`;
    const epoch = p.unit === "epoch" ? "" : jw.epoch(p);
    return epoch ? `${epoch} ${counter}` : counter;
  },

  // "45% 450/1000 5.4it/s ETA 1m42s"; an ended run: where it stopped
  progressText(p, live) {
    if (!p) return "";
    const parts = [jw.counter(p)];
    if (live && !jw.finished(p)) {
      if (p.stalled_for_s !== null) parts.push(`stalled ${jw.duration(p.stalled_for_s)}`);
      else if (p.rate) {
        parts.push(jw.rate(p));
        if (p.eta_s !== null) parts.push(`ETA ${jw.duration(Math.round(p.eta_s))}`);
      }
    }
    return parts.filter(Boolean).join(" ");
  },

  // a bar (when there is a total) and the text beside it
  progressCell(p, live) {
    if (!p) return "";
    const box = jw.el("div", { class: `progress${p.stalled_for_s !== null ? " stalled" : ""}`, "data-step": p.step });
    // the run's fraction; an epoch's bar of an unknown number of epochs shows that epoch's
    const shown = p.fraction !== null ? p.fraction : p.total && p.step !== null ? Math.min(p.step / p.total, 1) : null;
    if (shown !== null) {
      const fill = jw.el("div", { class: "fill" });
      fill.style.width = `${(shown * 100).toFixed(1)}%`;
      box.append(jw.el("div", { class: "bar", role: "progressbar", "aria-valuenow": jw.wholePercent(shown), "aria-valuemin": 0, "aria-valuemax": 100 }, fill));
    }
    box.append(jw.el("span", { class: "ptext" }, jw.progressText(p, live)));
    return box;
  },

  showError(message) {
    const p = document.getElementById("error");
    p.textContent = message || "";
    p.hidden = !message;
  },

  stamp() {
    const u = document.getElementById("updated");
    if (u) u.textContent = `updated ${jw.stamp24(Date.now() / 1000)} (${jw.zone()})`;
  },
};
