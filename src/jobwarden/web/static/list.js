// The job list: every job, refreshed every 5 s (the shim records at most once a second), filtered by
// state and name, a page of PAGE jobs at a time (the DOM of 10,000 rows would freeze a phone).
"use strict";

const REFRESH_MS = 5000;
const PAGE = 100;
const ENDED_STATES = ["succeeded", "failed", "stopped", "lost"];
const HUNG = ["no-progress", "fork-deadlock", "collective-hang", "uninterruptible-io"]; // the rules of a hang
let jobs = [];
let page = 0;

const $ = (id) => document.getElementById(id);
const cell = (cls, ...children) => jw.el("td", { class: cls }, ...children);

function row(job) {
  const link = jw.el("a", { href: `/jobs/${encodeURIComponent(job.id)}` }, job.id);
  const ended = job.exit_code !== null ? ` (exit ${job.exit_code})` : job.signal ? ` (${job.signal})` : "";
  const gpus = job.gpu_ids && job.gpu_ids.length ? job.gpu_ids.join(",") : "";
  const state = cell("state-cell", jw.stateBadge(job.state), ended);
  if (job.state === "queued" && job.queued_reason) state.append(jw.el("div", { class: "muted small" }, job.queued_reason));
  const over = ENDED_STATES.includes(job.state);
  return jw.el("tr", { "data-job": job.id, "data-state": job.state },
    cell("id", link),
    cell("name", jw.el("a", { href: `/jobs/${encodeURIComponent(job.id)}` }, job.name)),
    state,
    verdict(job),
    cell("prog", jw.progressCell(job.progress, job.state === "running")),
    cell("num dur", jw.runtime(job.started_at, job.ended_at)),
    cell("num ago", over ? jw.ago(job.ended_at) : ""),
    cell("num run", job.run),
    cell("gpus", gpus),
    cell("num cpu", jw.percent(job.cpu_percent)),
    cell("num rss", jw.bytes(job.rss_bytes)),
    cell("started", jw.time(job.started_at)),
    jw.el("td", { class: "cmd", title: job.command.join(" ") }, job.command.join(" ")));
}

// A job's severity, read off how it stands: a failed or lost run's verdict is why it failed (an error);
// on a run that succeeded or still runs, a finding is a warning
function severity(job) {
  return ["failed", "lost"].includes(job.state) ? "error" : "warning";
}

// The run's verdict: its title in the severity's colour, its rule beside it
function verdict(job) {
  if (!job.finding) return jw.el("td", { class: "verdict" });
  return jw.el("td", { class: `verdict sevtext sev-${severity(job)}`, title: job.finding_title || job.finding, "data-rule": job.finding },
    job.finding_title ? jw.el("span", { class: "ftitle" }, job.finding_title) : null, " ",
    jw.el("span", { class: "rule" }, `[${job.finding}]`));
}

function wanted(job) {
  const state = $("state-filter").value;
  const name = $("name-filter").value.trim().toLowerCase();
  if (state === "active" && ENDED_STATES.includes(job.state)) return false;
  if (state === "hung" && !(job.state === "running" && HUNG.includes(job.finding))) return false;
  if (!["all", "active", "hung"].includes(state) && job.state !== state) return false;
  return !name || job.name.toLowerCase().includes(name) || String(job.id) === name;
}

function draw() {
  const shown = jobs.filter(wanted);
  shown.sort((a, b) => b.id - a.id);
  const pages = Math.max(1, Math.ceil(shown.length / PAGE));
  page = Math.min(page, pages - 1);
  $("jobs").querySelector("tbody").replaceChildren(...shown.slice(page * PAGE, (page + 1) * PAGE).map(row));
  $("empty").hidden = jobs.length > 0;
  $("none-match").hidden = !(jobs.length > 0 && shown.length === 0);
  $("pager").hidden = pages < 2;
  $("page-info").textContent = `${page * PAGE + 1}–${Math.min(shown.length, (page + 1) * PAGE)} of ${shown.length}`;
  $("prev").disabled = page === 0;
  $("next").disabled = page >= pages - 1;
}

async function refresh() {
  try {
    jobs = await jw.get("/api/v1/jobs");
    const counts = {};
    for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
    $("counts").textContent = Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(" · ");
    draw();
    jw.showError("");
    jw.stamp();
  } catch (e) {
    jw.showError(`cannot read the jobs: ${e.message}`);
  }
}

$("state-filter").addEventListener("change", () => { page = 0; draw(); });
$("name-filter").addEventListener("input", () => { page = 0; draw(); });
$("prev").addEventListener("click", () => { page -= 1; draw(); });
$("next").addEventListener("click", () => { page += 1; draw(); });
refresh();
setInterval(refresh, REFRESH_MS);
