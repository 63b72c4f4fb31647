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
  document.getElementById("state").replaceChildren(jw.stateBadge(s.hung ? "hung" : s.state));
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
    ["rerun of", s.rerun_of ? jw.el("a", { href: `/jobs/${s.rerun_of}` }, `job ${s.rerun_of}`) : null],
    ["options", optionsText(s.options)],
    // the names of its --env keys: their values may be tokens, and are never sent
    ["env keys", s.env_keys && s.env_keys.length ? s.env_keys.join(", ") : null],
  ];
  const dl = document.getElementById("facts");
  dl.replaceChildren();
  for (const [k, v] of facts) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(jw.el("dt", {}, k), jw.el("dd", {}, v));
  }
  const live = !ENDED.includes(s.state);
  document.getElementById("stop").disabled = !live;
  const dump = document.getElementById("dump");
  if (!dump.dataset.busy) dump.disabled = !live; // an ended run has no process to take stacks of
  dump.title = live ? "take the stacks of every process now" : "the run has ended: its last stacks are below";
}

// The options it runs under, as `run` would take them ("timeout 1h · mem-limit 2.0 GiB · restart on-failure")
const OPTION_WORDS = {
  timeout_s: ["timeout", "s"], grace_s: ["grace", "s"], hang_timeout_s: ["hang-timeout", "s"],
  restart_delay_s: ["restart-delay", "s"], mem_limit_bytes: ["mem-limit", "bytes"], log_max_bytes: ["log-max", "bytes"],
  engine_budget_s: ["engine budget", "s"],
};
const OPTION_DEFAULTS = { on_hang: "dump", py_hooks: true, restart: "no", own_cgroup: true, attempt: 0 };

function optionsText(options) {
  if (!options) return null;
  const parts = [];
  for (const [k, v] of Object.entries(options)) {
    if (v === null || k === "version" || OPTION_DEFAULTS[k] === v || (k === "max_restarts" && options.restart === "no")) continue;
    if (k === "grace_s" && v === 10) continue;
    const [word, unit] = OPTION_WORDS[k] || [k.replace(/_/g, "-"), ""];
    const shown = k === "hang_timeout_s" && v === 0 ? "off" : unit === "s" ? jw.duration(v) : unit === "bytes" ? jw.bytes(v) : Array.isArray(v) ? v.join(",") : String(v);
    parts.push(`${word} ${shown}`);
  }
  return parts.length ? parts.join(" · ") : "defaults";
}

// What is true now, root cause first; what stopped being true (a hang that ended, a process continued)
// only as a muted line of history under it.
let findingsShown = null;

function renderFindings(findings) {
  const box = document.getElementById("findings");
  const key = JSON.stringify(findings);
  if (key === findingsShown) return; // unchanged: the cards stay (a selection in them too)
  findingsShown = key;
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

// Each attempt's own findings (its verdict), read once per attempt that has ended and again for the live one
const attemptFindings = {};

async function loadAttemptFindings(runs) {
  const wanted = runs.slice(-20).filter((r) => !(r.n in attemptFindings) || !ENDED.includes(r.state));
  let changed = false;
  for (const r of wanted) {
    try {
      const e = await jw.get(`${API}/explain?run=${r.n}`);
      attemptFindings[r.n] = e.findings.filter((f) => !f.resolved_at);
      changed = true;
    } catch (err) { /* the attempt was removed meanwhile: shown without */ }
  }
  if (changed && lastStatus) renderAttempts(lastStatus.runs, false);
}

function findingsCell(n) {
  const found = attemptFindings[n] || [];
  return jw.el("td", { class: "attempt-findings" }, ...found.map((f) =>
    jw.el("div", { class: `sevtext sev-${f.severity}`, "data-rule": f.rule, title: f.summary }, `${f.title} [${f.rule}]`)));
}

function resumedFrom(r) {
  return r.n > 1 && r.first_step !== null && r.first_step > 0 && r.first_step !== r.step ? `${r.first_step} → ` : "";
}

function renderAttempts(runs, load = true) {
  if (load) loadAttemptFindings(runs);
  document.querySelector("#attempts tbody").replaceChildren(...runs.map((r) =>
    jw.el("tr", { "data-run": r.n },
      jw.el("td", {}, jw.el("a", { href: `/jobs/${encodeURIComponent(JOB)}?run=${r.n}` }, r.n)),
      jw.el("td", {}, jw.stateBadge(r.state)), jw.el("td", {}, jw.time(r.started_at)),
      jw.el("td", {}, jw.time(r.ended_at)), jw.el("td", { class: "num" }, r.exit_code ?? ""),
      jw.el("td", {}, r.signal || ""), jw.el("td", {}, r.end_reason || ""),
      // how far each attempt got, and where a restarted one resumed (a first run starts at its start: the
      // first step seen, 10 of a run begun at 0, is only when jobwarden first looked)
      jw.el("td", { class: "num" }, r.step === null ? "" : `${resumedFrom(r)}${r.step}${r.total ? `/${r.total}` : ""}`),
      findingsCell(r.n))));
}

// What changed since the last success of the same command (`jobwarden diff`): asked again when the run or
// its state changes, and while its fingerprint is still being taken
let changesAsked = null;

async function refreshChanges(s) {
  const key = `${s.run}:${s.state}`;
  if (key === changesAsked) return;
  changesAsked = key;
  const box = document.getElementById("changes");
  try {
    const d = await jw.get(`${API}/diff${RUN_Q}`);
    if (d.changes === null) {
      if (/being taken|not started/.test(d.reason)) changesAsked = null;
      box.replaceChildren(jw.el("p", { class: "muted" }, d.reason));
      return;
    }
    const since = jw.el("a", { href: `/jobs/${encodeURIComponent(d.b.id)}?run=${d.b.run}` }, `run ${d.b.run} of job ${d.b.id}`);
    box.replaceChildren(
      jw.el("p", {}, "since ", since, ` succeeded (${jw.time(d.b.started_at)}):`),
      d.changes.length
        ? jw.el("ul", { class: "changes" }, ...d.changes.map((c) => jw.el("li", { "data-what": c.what }, c.line)))
        : jw.el("p", { class: "muted" }, "nothing changed"));
  } catch (e) {
    box.replaceChildren(jw.el("p", { class: "muted" }, `cannot read what changed: ${e.message}`));
  }
}

// main (the job's own process), rank (given a RANK by its launcher; its children inherit the variable, so
// one whose parent has the same rank is that rank's worker), worker: as `top` says it (tui/cells.py)
function role(p, procs, mainPid) {
  if (p.pid === mainPid) return "main";
  const parent = procs.find((q) => q.pid === p.ppid);
  if (p.rank !== null && p.rank !== undefined && (!parent || parent.rank !== p.rank)) return "rank";
  return "worker";
}

function renderProcesses(procs, mainPid) {
  document.getElementById("no-processes").hidden = procs.length > 0;
  document.querySelector("#processes tbody").replaceChildren(...procs.map((p) =>
    jw.el("tr", { "data-pid": p.pid },
      jw.el("td", { class: "num" }, p.pid), jw.el("td", { class: "num" }, p.ppid ?? ""),
      jw.el("td", {}, p.state || ""), jw.el("td", { class: "num" }, jw.percent(p.cpu_percent)),
      jw.el("td", { class: "num" }, jw.bytes(p.rss_bytes)), jw.el("td", { class: "num" }, jw.bytes(p.gpu_memory_bytes)),
      jw.el("td", {}, p.rank ?? ""), jw.el("td", { class: "role" }, role(p, procs, mainPid)),
      jw.el("td", { class: "cmd", title: p.cmdline }, p.cmdline))));
}

function renderRanks(ranks) {
  // each rank of a running distributed job: its own step and rate, the newest collective its flight
  // recorder named (a rank one call behind the others in a hang shows here), where its main thread is
  const rows = ranks || [];
  document.getElementById("ranks").hidden = rows.length === 0;
  const call = (c) => (c ? `#${c.seq} ${c.op}` : "");
  document.querySelector("#rank-rows tbody").replaceChildren(...rows.map((r) =>
    jw.el("tr", { "data-rank": r.rank },
      jw.el("td", { class: "num" }, r.rank), jw.el("td", { class: "num" }, r.pid),
      jw.el("td", { class: "num" }, r.step ?? ""),
      jw.el("td", { class: "num" }, r.rate === null || r.rate === undefined ? "" : `${r.rate.toFixed(2)}/s`),
      jw.el("td", { class: "collective" }, call(r.collective)),
      jw.el("td", {}, r.where || ""), jw.el("td", {}, r.where_detail || ""))));
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
    // the run's fraction; a bar per epoch also says which epoch (as `status` does)
    const epoch = p.epoch && p.epoch.total && p.unit !== "epoch" ? `, epoch ${p.epoch.n}/${p.epoch.total}` : "";
    const where = p.total ? `${jw.wholePercent(p.fraction)}%${epoch}, step ${p.step}/${p.total}` : `step ${p.step}`;
    text = `${p.total && p.step >= p.total && (p.fraction === null || p.fraction >= 1) ? "reached" : "stopped at"} ${where}`;
  }
  const cell = jw.progressCell(p, live);
  cell.querySelector(".ptext").textContent = text;
  document.getElementById("progress-bar").replaceChildren(cell);
  const facts = [];
  if (p.label) facts.push(p.label);
  if (p.epoch !== null && p.step !== null && !live && !/epoch/i.test(p.label || "")) facts.push(jw.epoch(p));
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
    refreshChanges(s);
    renderProcesses(s.processes, s.pid);
    renderRanks(s.ranks);
    jw.showError("");
    jw.stamp();
  } catch (e) {
    jw.showError(`cannot read the job: ${e.message}`);
  }
}

// --- charts -----------------------------------------------------------------------------------------
// Each chart spans the run itself (its start to its end, or to now), its y axis as wide as its widest
// label (never clipped), its x axis in local 24-hour time with room between labels. Where a point
// merges several readings (a long run thinned to a few hundred points) its peak is drawn too, so a
// 200 MiB spike before an OOM kill is not flattened into a mean of 143.

function rate(t, v) {
  // cumulative byte counters as bytes per second between samples
  return v.map((x, i) => (i === 0 || x === null || v[i - 1] === null || t[i] <= t[i - 1] || x < v[i - 1])
    ? null : (x - v[i - 1]) / (t[i] - t[i - 1]));
}

function lossOf(sample) {
  const name = lossName(Object.keys(sample.metrics || {}));
  return name === null ? null : sample.metrics[name];
}

const peakOf = (peak, mean) => (s) => s[peak] ?? s[mean] ?? null;
const memLimit = () => (lastStatus && lastStatus.options && lastStatus.options.mem_limit_bytes) || null;
const PEAK = { width: 1, dash: [3, 3] };
// where --mem-limit was set: a series for the legend and the y range, drawn across the whole width by limitLine
const LIMIT = { width: 0, points: { show: false }, when: () => memLimit() !== null };

// series: [value (a sample's key or a function of it), label, colour, style]
// a percent tick with the decimals its step needs ("0.5%", not "1%" twice)
const pct = (v, incr) => `${v.toFixed(incr !== undefined && incr < 1 ? (incr < 0.1 ? 2 : 1) : 0)}%`;

const CHARTS = [
  // progress first, shown only where the job shows it (a step counter, a loss)
  { id: "step_rate", title: "Step rate (steps per second, measured by jobwarden)", series: [["step_rate", "steps/s", "#0550ae"]], fmt: (v) => `${jw.figure(v)}/s`, optional: true, first: true },
  { id: "loss", title: "Loss (as the job reports it)", series: [[lossOf, "loss", "#bc4c00"]], fmt: (v) => String(Number(Number(v).toPrecision(4))), optional: true, first: true, anyRange: true },
  { id: "cpu", title: "CPU (% of one core)", series: [["cpu_percent", "CPU % (mean)", "#0969da"], [peakOf("cpu_max_percent", "cpu_percent"), "peak", "#54aeff", PEAK]], fmt: (v) => `${v.toFixed(1)}%`, tick: pct },
  { id: "rss", title: "Memory (RSS)", series: [["rss_bytes", "RSS (mean)", "#8250df"], [peakOf("rss_max_bytes", "rss_bytes"), "peak", "#c297ff", PEAK], [memLimit, "limit", "#cf222e", LIMIT]], fmt: jw.bytes },
  { id: "nprocs", title: "Processes", series: [["nprocs", "processes", "#1a7f37"]], fmt: (v) => v.toFixed(0), whole: true },
  { id: "io", title: "I/O (per second)", series: [["io_read_bytes", "read", "#bf8700"], ["io_write_bytes", "write", "#cf222e"]], fmt: (v) => `${jw.bytes(v)}/s`, rate: true },
  // only where GPUs were measured: a CPU job has no empty GPU charts
  { id: "gpu_util", title: "GPU utilisation", series: [["gpu_util", "GPU util %", "#116329"]], fmt: (v) => `${v.toFixed(1)}%`, tick: pct, optional: true },
  { id: "gpu_mem", title: "GPU memory", series: [["gpu_memory_bytes", "GPU memory", "#953800"]], fmt: jw.bytes, optional: true },
];
const plots = {};
window.jwPlots = plots; // the browser tests measure what was drawn

// the chart's series now (a limit line only where there is a limit)
function seriesOf(def) {
  return def.series.filter(([, , , style]) => !(style && style.when) || style.when());
}

function chartData(def, samples) {
  const t = samples.map((s) => s.t);
  return [t, ...seriesOf(def).map(([key]) => {
    const v = samples.map((s) => (typeof key === "function" ? key(s) : s[key] === undefined ? null : s[key]));
    return def.rate ? rate(t, v) : v;
  })];
}

const seconds = (iso) => (iso ? Date.parse(iso) / 1000 : null);

// The run's own span: from its start to its end (or now), widened only to hold a sample outside it
function runSpan(u, min, max) {
  const s = lastStatus;
  let lo = seconds(s && s.started_at) ?? min;
  let hi = seconds(s && s.ended_at) ?? (s && ENDED.includes(s.state) ? max : Date.now() / 1000);
  if (min !== null && (lo === null || min < lo)) lo = min;
  if (max !== null && (hi === null || max > hi)) hi = max;
  if (lo === null || hi === null) { const now = Date.now() / 1000; return [now - 60, now]; }
  return hi - lo < 1 ? [lo, lo + 1] : [lo, hi];
}

// from 0 to a little over the top (a limit line included), so a flat line is not drawn as noise
function fromZero(u, min, max) {
  return [0, max > 0 ? max * 1.08 : 1];
}

// ticks a whole number of seconds, minutes, hours or days apart: a label is never said twice
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
  172800, 604800, 2592000];
const HALF_TIME_LABEL = 34; // px: "00:00:00" in the axis font is about 50
const RIGHT_ROOM = 34; // px right of the plot, for the half of the last time label that sticks out

// y: as wide as the widest label (uPlot's own sizing cycle), measured in the axis's own font
function labelRoom(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  u.ctx.font = axis.font[0];
  const widest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(String(v)).width / devicePixelRatio));
  // at least half a time label: the first one, centred on the plot's left edge, stays on the canvas
  return Math.ceil(Math.max(widest + axis.ticks.size + axis.gap + 6, HALF_TIME_LABEL));
}

// x: local 24-hour times; where the day changes its date under the time (the first day is in the title)
function timeLabels(u, splits, axisIdx, space, incr) {
  let day = splits.length ? dayOf(splits[0]) : null;
  return splits.map((t) => {
    const d = new Date(t * 1000);
    const clock = incr < 60 ? jw.stamp24(t) : `${jw.pad(d.getHours())}:${jw.pad(d.getMinutes())}`;
    const today = dayOf(t);
    const label = day === today ? clock : `${clock}\n${today.slice(5)}`;
    day = today;
    return label;
  });
}

function dayOf(t) {
  return jw.stamp24(t, true).slice(0, 10);
}

// the x axis's title: the day and the zone ("2026-11-25, local time UTC+01:00")
function timeTitle(u) {
  const lo = u.scales.x.min;
  return lo === undefined || lo === null ? `local time (${jw.zone()})` : `${dayOf(lo)}, local time (${jw.zone(lo)})`;
}

// The memory limit from the run's start to its end, not only between the samples
function limitLine(u) {
  const limit = memLimit();
  if (limit === null) return;
  const y = Math.round(u.valToPos(limit, "y", true)) + 0.5;
  const { ctx } = u;
  ctx.save();
  ctx.strokeStyle = "#cf222e";
  ctx.lineWidth = 1.5 * devicePixelRatio;
  ctx.setLineDash([8 * devicePixelRatio, 5 * devicePixelRatio]);
  ctx.beginPath();
  ctx.moveTo(u.bbox.left, y);
  ctx.lineTo(u.bbox.left + u.bbox.width, y);
  ctx.stroke();
  ctx.restore();
}

function chartWidth(box) {
  return Math.max(200, box.clientWidth - 14);
}

function makeChart(def, data) {
  const box = jw.el("div", { class: "chart", id: `chart-${def.id}` }, jw.el("h3", {}, def.title));
  const empty = jw.el("p", { class: "empty", hidden: true }, "no data (not measured for this job)");
  box.append(empty);
  const charts = document.getElementById("charts");
  charts.insertBefore(box, def.first ? charts.querySelector(".chart:not(.progress-chart)") : null);
  if (def.first) box.classList.add("progress-chart");
  // the legend shows the value under the cursor, and the newest one when no cursor is on the chart
  // (uPlot asks with idx null then, and showed "–" until the chart was hovered)
  const fmt = (u, v, si, idx) => {
    const shown = idx === null || idx === undefined ? newest(u.data[si]) : v;
    return shown === null || shown === undefined ? "–" : def.fmt(shown);
  };
  const axisFont = "11px system-ui, -apple-system, sans-serif";
  const opts = {
    width: chartWidth(box), height: 190, legend: { live: true }, padding: [10, RIGHT_ROOM, 0, 0],
    scales: { x: { time: true, range: runSpan }, y: def.anyRange ? {} : { range: fromZero } },
    series: [
      { value: (u, t, si, idx) => {
        const shown = idx === null || idx === undefined ? newest(u.data[0]) : t;
        return shown === null || shown === undefined ? "–" : jw.stamp24(shown, true);
      } },
      ...seriesOf(def).map(([, label, color, style]) => {
        const { when, ...look } = style || {};
        return { label, stroke: color, width: 1.5, value: fmt, spanGaps: false, ...look };
      }),
    ],
    axes: [
      { font: axisFont, space: 90, values: timeLabels, incrs: TIME_STEPS, label: "local time", labelSize: 16, labelFont: axisFont, size: 42 },
      { font: axisFont, size: labelRoom, values: (u, vals, i, space, incr) => vals.map((v) => (def.tick || def.fmt)(v, incr)),
        ...(def.whole ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] } : {}) },
    ],
  };
  opts.hooks = {
    drawClear: [(u) => { u.axes[0].label = timeTitle(u); }], // before the axes are drawn
    draw: def.id === "rss" ? [limitLine] : [],
  };
  plots[def.id] = { plot: new uPlot(opts, data, box), box, empty };
  plots[def.id].plot.setLegend({ idx: null });
}

function newest(values) {
  for (let i = (values || []).length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i];
  return null;
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
      if (def.optional && !plots[def.id] && allNull(data)) continue; // not measured for this job: no chart
      if (!plots[def.id]) makeChart(def, data);
      else {
        plots[def.id].plot.setData(data);
        if (plots[def.id].plot.cursor.idx === null) plots[def.id].plot.setLegend({ idx: null }); // the newest
      }
      const none = allNull(data);
      plots[def.id].empty.hidden = !none;
      plots[def.id].plot.root.hidden = none; // no axes drawn around nothing
      plots[def.id].box.classList.toggle("nodata", none);
    }
    const note = document.getElementById("charts-note");
    note.hidden = samples.length > 0;
    note.textContent = lastStatus && ENDED.includes(lastStatus.state)
      ? "no samples were recorded (the run ended before its first)" : "no samples recorded yet";
    document.getElementById("charts").dataset.drawn = samples.length;
  } catch (e) {
    jw.showError(`cannot read the samples: ${e.message}`);
  }
}

window.addEventListener("resize", () => {
  for (const { plot, box } of Object.values(plots)) plot.setSize({ width: chartWidth(box), height: 190 });
});

// --- live log ---------------------------------------------------------------------------------------
// Colours as the terminal shows them, a progress bar's redraws as its last frame (ansi.js).

const logView = new LogView(document.getElementById("log"), MAX_LOG_LINES);

function followLog() {
  const state = document.getElementById("log-state");
  const source = new EventSource(`${API}/log/stream${RUN_Q}`);
  source.addEventListener("log", (ev) => { logView.append(JSON.parse(ev.data).text); state.textContent = "following"; });
  source.addEventListener("end", (ev) => {
    const end = JSON.parse(ev.data);
    state.textContent = `run ended: ${end.state}`;
    logView.box.dataset.ended = end.state;
    source.close();
    refreshStatus();
  });
  source.onerror = () => { if (source.readyState !== EventSource.CLOSED) state.textContent = "reconnecting…"; };
  document.getElementById("full-log").href = `/jobs/${encodeURIComponent(JOB)}/log${RUN_Q}`;
  document.getElementById("download-log").href = `${API}/log${RUN_Q}`;
  searchBox(logView, document.getElementById("log-search"), document.getElementById("log-hits"));
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
  const rerun = document.getElementById("rerun");
  if (readOnly) { stop.hidden = true; dump.hidden = true; rerun.hidden = true; say("read-only"); return; }
  onSecondClick(stop, "Click again to stop", async () => {
    stop.disabled = true; stop.textContent = "Stopping…";
    try {
      const r = await jw.post(`${API}/stop`);
      say(r.already_ended ? `already ${r.state}` : `stopped: ${r.state}`);
    } catch (e) { say(`stop failed: ${e.message}`); }
    stop.textContent = "Stop";
    refreshStatus();
  });
  dump.addEventListener("click", async () => {
    dump.disabled = true; dump.dataset.busy = "1"; say("taking stacks…");
    try {
      const r = await jw.post(`${API}/dump`);
      say(`stacks of ${r.length} process(es)`);
    } catch (e) { say(`dump failed: ${e.message}`); }
    delete dump.dataset.busy;
    dump.disabled = lastStatus !== null && ENDED.includes(lastStatus.state);
    refreshStacks();
  });
  // `jobwarden rerun`: the same command, cwd, --env and options as a new job (the server runs the same code)
  onSecondClick(rerun, "Click again to start it again", async () => {
    rerun.disabled = true; say("starting it again…");
    try {
      const r = await jw.post(`${API}/rerun`);
      const result = document.getElementById("action-result");
      result.replaceChildren(`started job ${r.id} (${r.state}), a rerun of job ${r.rerun_of}: `,
        jw.el("a", { id: "rerun-link", href: `/jobs/${encodeURIComponent(r.id)}` }, `open job ${r.id}`));
    } catch (e) { say(`rerun failed: ${e.message}`); }
    rerun.disabled = false;
  });
}

// An action that changes something (stop a job, start a new one) on a second click within 5 s: the first
// arms the button and says so, no modal dialog
function onSecondClick(button, armedText, action) {
  const label = button.textContent;
  let disarm = null; // the pending timer while armed
  const reset = () => {
    clearTimeout(disarm); disarm = null;
    button.classList.remove("armed"); button.textContent = label;
  };
  button.addEventListener("click", async () => {
    if (disarm === null) {
      button.classList.add("armed"); button.textContent = armedText;
      disarm = setTimeout(reset, 5000);
      return;
    }
    reset();
    await action();
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
