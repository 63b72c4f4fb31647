// One job's page: its state and how it ended, findings, attempts, resource charts (uPlot), processes,
// the live output (Server-Sent Events, resumed by byte offset) and the stop and dump buttons.
"use strict";

const JOB = document.body.dataset.job;
const RUN = new URLSearchParams(location.search).get("run");
const RUN_Q = RUN ? `?run=${encodeURIComponent(RUN)}` : "";
const API = `/api/v1/jobs/${encodeURIComponent(JOB)}`;
const STATUS_MS = 5000;
const SAMPLES_MS = 10000;
const MAX_LOG_LINES = 5000; // the DOM of a long log stays small; the full log is a link away
const ENDED = ["succeeded", "failed", "stopped"];

let lastStatus = null;

// --- status: header, findings, attempts, processes --------------------------------------------------

function howItEnded(s) {
  if (s.signal) return `killed by ${s.signal}`;
  if (s.exit_code !== null) return `exit code ${s.exit_code}`;
  return s.end_reason || "";
}

function renderSummary(s) {
  document.getElementById("state").replaceChildren(jw.stateBadge(s.state));
  document.getElementById("ended").textContent = ENDED.includes(s.state) || s.state === "lost"
    ? [howItEnded(s), s.end_reason ? `(${s.end_reason})` : ""].join(" ") : `run ${s.run}`;
  const queued = document.getElementById("queued");
  queued.hidden = !(s.state === "queued" && s.queued_reason);
  queued.textContent = s.queued_reason ? `Waiting: ${s.queued_reason}` : "";
  const facts = [
    ["command", s.command.join(" ")], ["cwd", s.cwd], ["run", s.run], ["pid", s.pid],
    ["started", jw.time(s.started_at)], ["ended", jw.time(s.ended_at)],
    ["GPUs", s.gpu_ids.length ? s.gpu_ids.join(",") : null], ["error", s.error],
    ["orphans left", s.orphans_left && s.orphans_left.length ? JSON.stringify(s.orphans_left) : null],
  ];
  const dl = document.getElementById("facts");
  dl.replaceChildren();
  for (const [k, v] of facts) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(jw.el("dt", {}, k), jw.el("dd", {}, v));
  }
  const live = !ENDED.includes(s.state);
  document.getElementById("stop").disabled = !live;
}

// What is true now, root cause first; what stopped being true (a hang that ended, a process continued)
// only as a muted line of history under it.
function renderFindings(findings) {
  const box = document.getElementById("findings");
  const current = findings.filter((f) => !f.resolved_at);
  const resolved = findings.filter((f) => f.resolved_at);
  const history = resolved.map((f) => jw.el("p", { class: "muted resolved", "data-rule": f.rule },
    `resolved: ${f.title} [${f.rule}], ${jw.time(f.at)} – ${jw.time(f.resolved_at)}`));
  if (!current.length) {
    box.replaceChildren(jw.el("p", { class: "muted" }, resolved.length ? "nothing now" : "none"), ...history);
    return;
  }
  box.replaceChildren(...current.map((f) => {
    const who = [];
    if (f.pids && f.pids.length) who.push(`pid ${f.pids.join(", ")}`);
    if (f.rank !== null && f.rank !== undefined) who.push(`rank ${f.rank}`);
    return jw.el("article", { class: `card finding sev-${f.severity}`, "data-rule": f.rule },
      jw.el("h3", {}, f.title, jw.el("span", { class: "sev" }, `${f.severity} · ${f.rule}`)),
      jw.el("p", {}, f.summary),
      who.length ? jw.el("p", { class: "muted" }, who.join(" · ")) : null,
      f.evidence.length ? jw.el("ul", {}, ...f.evidence.map((e) => jw.el("li", {}, e))) : null,
      f.remedy ? jw.el("div", { class: "remedy" }, jw.el("b", {}, "What to do: "), f.remedy) : null);
  }), ...history);
}

function renderAttempts(runs) {
  document.querySelector("#attempts tbody").replaceChildren(...runs.map((r) =>
    jw.el("tr", {},
      jw.el("td", {}, jw.el("a", { href: `/jobs/${encodeURIComponent(JOB)}?run=${r.n}` }, r.n)),
      jw.el("td", {}, jw.stateBadge(r.state)), jw.el("td", {}, jw.time(r.started_at)),
      jw.el("td", {}, jw.time(r.ended_at)), jw.el("td", { class: "num" }, r.exit_code ?? ""),
      jw.el("td", {}, r.signal || ""), jw.el("td", {}, r.end_reason || ""),
      // how far each attempt got: from its first step seen to its last (where the next one resumed)
      jw.el("td", { class: "num" }, r.step === null ? "" : `${r.first_step !== null && r.first_step !== r.step ? `${r.first_step} → ` : ""}${r.step}${r.total ? `/${r.total}` : ""}`))));
}

function renderProcesses(procs) {
  document.getElementById("no-processes").hidden = procs.length > 0;
  document.querySelector("#processes tbody").replaceChildren(...procs.map((p) =>
    jw.el("tr", {},
      jw.el("td", { class: "num" }, p.pid), jw.el("td", { class: "num" }, p.ppid ?? ""),
      jw.el("td", {}, p.state || ""), jw.el("td", { class: "num" }, jw.percent(p.cpu_percent)),
      jw.el("td", { class: "num" }, jw.bytes(p.rss_bytes)), jw.el("td", { class: "num" }, jw.bytes(p.gpu_memory_bytes)),
      jw.el("td", {}, p.rank ?? ""), jw.el("td", { class: "cmd", title: p.cmdline }, p.cmdline))));
}

function metricsText(metrics) {
  // the loss first (progress.model.loss_name), then what else the job reported
  const names = Object.keys(metrics || {});
  const loss = lossName(names);
  if (loss) names.splice(names.indexOf(loss), 1), names.unshift(loss);
  return names.slice(0, 4).map((k) => `${k} ${String(Number(Number(metrics[k]).toPrecision(4)))}`).join(" · ");
}

function lossName(names) {
  const rank = (k) => (k.toLowerCase() === "loss" ? 0 : 2) + (/val|eval/i.test(k) ? 1 : 0);
  const found = names.filter((k) => k.toLowerCase().includes("loss"));
  found.sort((a, b) => rank(a) - rank(b)); // stable: the job's order among equals
  return found[0] || null;
}

function renderProgress(s) {
  const box = document.getElementById("progress");
  const p = s.progress;
  box.hidden = !p;
  if (!p) return;
  const live = s.state === "running";
  let text = jw.progressText(p, live);
  if (!live && p.step !== null) {
    const where = p.total ? `${Math.round((p.fraction || 0) * 100)}%, step ${p.step}/${p.total}` : `step ${p.step}`;
    text = `${p.total && p.step >= p.total ? "reached" : "stopped at"} ${where}`;
  }
  const cell = jw.progressCell(p, live);
  cell.querySelector(".ptext").textContent = text;
  document.getElementById("progress-bar").replaceChildren(cell);
  const facts = [];
  if (p.label) facts.push(p.label);
  if (p.epoch !== null && p.step !== null && !/epoch/i.test(p.label || "")) facts.push(`epoch ${p.epoch}`);
  const metrics = metricsText(p.metrics);
  if (metrics) facts.push(metrics);
  const how = { "in-process": "read in-process", log: "from the log" }[p.observed];
  facts.push(how ? `${p.format}, ${how}` : p.format);
  facts.push(`updated ${jw.time(p.at)}`);
  const before = (s.runs || []).find((r) => r.n === s.run - 1);
  if (p.first_step !== null && before && before.step !== null) {
    facts.push(`resumed at step ${p.first_step} (run ${before.n} had reached ${before.total ? `${before.step}/${before.total}` : before.step})`);
  }
  document.getElementById("progress-facts").textContent = facts.join(" · ");
}

async function refreshStatus() {
  try {
    const s = await jw.get(API + RUN_Q);
    lastStatus = s;
    renderSummary(s);
    renderProgress(s);
    renderFindings(s.findings);
    renderAttempts(s.runs);
    renderProcesses(s.processes);
    jw.showError("");
    jw.stamp();
  } catch (e) {
    jw.showError(`cannot read the job: ${e.message}`);
  }
}

// --- charts -----------------------------------------------------------------------------------------

function rate(t, v) {
  // cumulative byte counters as bytes per second between samples
  return v.map((x, i) => (i === 0 || x === null || v[i - 1] === null || t[i] <= t[i - 1] || x < v[i - 1])
    ? null : (x - v[i - 1]) / (t[i] - t[i - 1]));
}

function lossOf(sample) {
  const name = lossName(Object.keys(sample.metrics || {}));
  return name === null ? null : sample.metrics[name];
}

const CHARTS = [
  // progress first, shown only where the job shows it (a step counter, a loss)
  { id: "step_rate", title: "Step rate (steps per second, measured by jobwarden)", series: [["step_rate", "steps/s", "#0550ae"]], fmt: (v) => `${jw.figure(v)}/s`, optional: true },
  { id: "loss", title: "Loss (as the job reports it)", series: [[lossOf, "loss", "#bc4c00"]], fmt: (v) => String(Number(Number(v).toPrecision(4))), optional: true },
  { id: "cpu", title: "CPU (% of one core)", series: [["cpu_percent", "CPU %", "#0969da"]], fmt: (v) => `${v.toFixed(0)}%` },
  { id: "rss", title: "Memory (RSS)", series: [["rss_bytes", "RSS", "#8250df"]], fmt: jw.bytes },
  { id: "nprocs", title: "Processes", series: [["nprocs", "processes", "#1a7f37"]], fmt: (v) => v.toFixed(0) },
  { id: "io", title: "I/O (per second)", series: [["io_read_bytes", "read", "#bf8700"], ["io_write_bytes", "write", "#cf222e"]], fmt: (v) => `${jw.bytes(v)}/s`, rate: true },
  { id: "gpu_util", title: "GPU utilisation", series: [["gpu_util", "GPU util %", "#116329"]], fmt: (v) => `${v.toFixed(0)}%` },
  { id: "gpu_mem", title: "GPU memory", series: [["gpu_memory_bytes", "GPU memory", "#953800"]], fmt: jw.bytes },
];
const plots = {};

function chartData(def, samples) {
  const t = samples.map((s) => s.t);
  return [t, ...def.series.map(([key]) => {
    const v = samples.map((s) => (typeof key === "function" ? key(s) : s[key] === undefined ? null : s[key]));
    return def.rate ? rate(t, v) : v;
  })];
}

function xRange(u, min, max) {
  if (min === null || max === null) { const now = Date.now() / 1000; return [now - 60, now]; }
  return max - min < 60 ? [min - 30, max + 30] : [min, max];
}

function makeChart(def, data) {
  const box = jw.el("div", { class: "chart", id: `chart-${def.id}` }, jw.el("h3", {}, def.title));
  const empty = jw.el("p", { class: "empty", hidden: true }, "no data (not measured for this job)");
  box.append(empty);
  const charts = document.getElementById("charts");
  charts.insertBefore(box, def.optional ? charts.querySelector(".chart:not(.progress-chart)") : null);
  if (def.optional) box.classList.add("progress-chart");
  const fmt = (u, v) => (v === null || v === undefined ? "–" : def.fmt(v));
  const opts = {
    width: Math.max(300, box.clientWidth - 14), height: 180, legend: { live: true },
    // a short run (or one sample) would otherwise be drawn across years
    scales: { x: { time: true, range: xRange } },
    series: [{}, ...def.series.map(([, label, color]) => ({ label, stroke: color, width: 1.5, value: fmt, spanGaps: false }))],
    axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => def.fmt(v)) }],
  };
  plots[def.id] = { plot: new uPlot(opts, data, box), box, empty };
}

function allNull(data) {
  return data.slice(1).every((s) => s.every((v) => v === null));
}

async function refreshSamples() {
  if (typeof uPlot === "undefined") return;
  try {
    const sep = RUN_Q ? "&" : "?";
    const samples = await jw.get(`${API}/samples${RUN_Q}${sep}points=600`);
    for (const def of CHARTS) {
      const data = chartData(def, samples);
      if (def.optional && !plots[def.id] && allNull(data)) continue; // a job without progress: no chart
      if (!plots[def.id]) makeChart(def, data);
      else plots[def.id].plot.setData(data);
      plots[def.id].empty.hidden = !allNull(data);
    }
    const note = document.getElementById("charts-note");
    note.hidden = samples.length > 0;
    note.textContent = "no samples recorded yet";
  } catch (e) {
    jw.showError(`cannot read the samples: ${e.message}`);
  }
}

window.addEventListener("resize", () => {
  for (const { plot, box } of Object.values(plots)) plot.setSize({ width: Math.max(300, box.clientWidth - 14), height: 180 });
});

// --- live log ---------------------------------------------------------------------------------------

const logBox = document.getElementById("log");
let partialLine = false;

function lastSegment(line) {
  // a progress bar redraws its line with \r: show what the terminal would
  const i = line.lastIndexOf("\r", line.length - 2);
  return i >= 0 ? line.slice(i + 1) : line;
}

function appendLog(text) {
  const stick = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
  const parts = text.split("\n");
  const complete = parts[parts.length - 1] === "";
  if (complete) parts.pop();
  parts.forEach((part, i) => {
    if (i === 0 && partialLine && logBox.lastChild) {
      logBox.lastChild.textContent = lastSegment(logBox.lastChild.textContent + part);
    } else {
      logBox.append(jw.el("div", {}, lastSegment(part)));
    }
  });
  partialLine = !complete;
  while (logBox.childElementCount > MAX_LOG_LINES) logBox.firstChild.remove();
  if (stick) logBox.scrollTop = logBox.scrollHeight;
}

function followLog() {
  const state = document.getElementById("log-state");
  const source = new EventSource(`${API}/log/stream${RUN_Q}`);
  source.addEventListener("log", (ev) => { appendLog(JSON.parse(ev.data).text); state.textContent = "following"; });
  source.addEventListener("end", (ev) => {
    const end = JSON.parse(ev.data);
    state.textContent = `run ended: ${end.state}`;
    logBox.dataset.ended = end.state;
    source.close();
    refreshStatus();
  });
  source.onerror = () => { if (source.readyState !== EventSource.CLOSED) state.textContent = "reconnecting…"; };
  document.getElementById("full-log").href = `${API}/log${RUN_Q}`;
}

// --- stacks, stop, dump ----------------------------------------------------------------------------

async function refreshStacks() {
  try {
    const dumps = await jw.get(`${API}/stacks${RUN_Q}`);
    const box = document.getElementById("stacks");
    if (!dumps.length) { box.replaceChildren(jw.el("p", { class: "muted" }, "none taken")); return; }
    const last = dumps[dumps.length - 1];
    box.replaceChildren(jw.el("div", { class: "stack" },
      jw.el("p", {}, `${jw.time(last.at)}, taken by ${last.trigger}` +
        (dumps.length > 1 ? ` (${dumps.length - 1} earlier shown by jobwarden dump)` : "")),
      jw.el("pre", {}, last.text.join("\n"))));
  } catch (e) {
    jw.showError(`cannot read the stacks: ${e.message}`);
  }
}

function say(text) { document.getElementById("action-result").textContent = text; }

function setupActions(readOnly) {
  const stop = document.getElementById("stop");
  const dump = document.getElementById("dump");
  if (readOnly) { stop.hidden = true; dump.hidden = true; say("read-only"); return; }
  let armedUntil = 0;
  stop.addEventListener("click", async () => {
    if (Date.now() > armedUntil) { // first click arms, the second (within 5 s) stops: no modal dialog
      armedUntil = Date.now() + 5000;
      stop.classList.add("armed"); stop.textContent = "Click again to stop";
      setTimeout(() => { stop.classList.remove("armed"); stop.textContent = "Stop"; }, 5000);
      return;
    }
    armedUntil = 0; stop.disabled = true; stop.classList.remove("armed"); stop.textContent = "Stopping…";
    try {
      const r = await jw.post(`${API}/stop`);
      say(r.already_ended ? `already ${r.state}` : `stopped: ${r.state}`);
    } catch (e) { say(`stop failed: ${e.message}`); }
    stop.textContent = "Stop";
    refreshStatus();
  });
  dump.addEventListener("click", async () => {
    dump.disabled = true; say("taking stacks…");
    try {
      const r = await jw.post(`${API}/dump`);
      say(`stacks of ${r.length} process(es)`);
    } catch (e) { say(`dump failed: ${e.message}`); }
    dump.disabled = false;
    refreshStacks();
  });
}

async function start() {
  let readOnly = false;
  try { readOnly = (await jw.get("/api/v1/server")).read_only === true; } catch (e) { /* shown by the others */ }
  setupActions(readOnly);
  await refreshStatus();
  performance.mark("jobwarden:status-drawn"); // what scripts/bench-web times
  followLog();
  refreshSamples();
  refreshStacks();
  setInterval(() => { if (!lastStatus || !ENDED.includes(lastStatus.state)) refreshStatus(); }, STATUS_MS);
  setInterval(() => { if (!lastStatus || !ENDED.includes(lastStatus.state)) refreshSamples(); }, SAMPLES_MS);
}

start();
