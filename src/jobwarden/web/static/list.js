// The job list: a page of PAGE jobs at a time, refreshed every 5 s (the shim records at most once a
// second), filtered by state and name on the server (the whole list of 10,000 jobs is megabytes, and
// their DOM would freeze a phone).
"use strict";

const REFRESH_MS = 5000;
const PAGE = 100;
const ENDED_STATES = ["succeeded", "failed", "stopped", "lost"];
let jobs = []; // the page shown, newest first
let total = 0; // the jobs that match the filters
let everything = 0; // every job
let page = 0;
let asked = 0; // the newest request: an older answer that arrives after it is dropped

const $ = (id) => document.getElementById(id);
const cell = (cls, ...children) => jw.el("td", { class: cls }, ...children);

function row(job) {
  const link = jw.el("a", { href: `/jobs/${encodeURIComponent(job.id)}` }, job.id);
  const ended = job.exit_code !== null ? ` (exit ${job.exit_code})` : job.signal ? ` (${job.signal})` : "";
  const gpus = job.gpu_ids && job.gpu_ids.length ? job.gpu_ids.join(",") : "";
  const state = cell("state-cell", jw.stateBadge(job.hung ? "hung" : job.state), ended);
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

function draw() {
  const pages = Math.max(1, Math.ceil(total / PAGE));
  $("jobs").querySelector("tbody").replaceChildren(...jobs.map(row));
  $("empty").hidden = everything > 0;
  $("none-match").hidden = !(everything > 0 && total === 0);
  $("pager").hidden = pages < 2;
  $("page-info").textContent = `${page * PAGE + 1}–${Math.min(total, (page + 1) * PAGE)} of ${total}`;
  $("prev").disabled = page === 0;
  $("next").disabled = page >= pages - 1;
}

async function refresh() {
  const query = new URLSearchParams({
    limit: PAGE, offset: page * PAGE, state: $("state-filter").value, name: $("name-filter").value.trim(),
  });
  const mine = ++asked;
  try {
    const r = await fetch(`/api/v1/jobs?${query}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(await jw.problem(r));
    const answer = await r.json();
    if (mine !== asked) return;
    total = Number(r.headers.get("X-Total-Count"));
    if (page > 0 && page * PAGE >= total) { // the page emptied since (jobs removed, a narrower filter)
      page = Math.max(0, Math.ceil(total / PAGE) - 1);
      return refresh();
    }
    jobs = answer;
    const counts = JSON.parse(r.headers.get("X-State-Counts") || "{}");
    everything = Object.values(counts).reduce((a, b) => a + b, 0);
    $("counts").textContent = Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(" · ");
    draw();
    jw.showError("");
    jw.stamp();
  } catch (e) {
    jw.showError(`cannot read the jobs: ${e.message}`);
  }
}

$("state-filter").addEventListener("change", () => { page = 0; refresh(); });
$("name-filter").addEventListener("input", () => { page = 0; refresh(); });
$("prev").addEventListener("click", () => { page -= 1; refresh(); });
$("next").addEventListener("click", () => { page += 1; refresh(); });
refresh();
setInterval(refresh, REFRESH_MS);
