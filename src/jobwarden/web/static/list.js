// The job list: every job, refreshed every 5 s (the shim records at most once a second).
"use strict";

const REFRESH_MS = 5000;

function row(job) {
  const link = jw.el("a", { href: `/jobs/${encodeURIComponent(job.id)}` }, job.id);
  const ended = job.exit_code !== null ? ` (exit ${job.exit_code})` : job.signal ? ` (${job.signal})` : "";
  const gpus = job.gpu_ids && job.gpu_ids.length ? job.gpu_ids.join(",") : "";
  const state = jw.el("td", {}, jw.stateBadge(job.state), ended);
  if (job.state === "queued" && job.queued_reason) state.append(jw.el("div", { class: "muted small" }, job.queued_reason));
  return jw.el("tr", { "data-job": job.id, "data-state": job.state },
    jw.el("td", {}, link),
    jw.el("td", {}, jw.el("a", { href: `/jobs/${encodeURIComponent(job.id)}` }, job.name)),
    state,
    jw.el("td", { class: "num" }, job.run),
    jw.el("td", {}, gpus),
    jw.el("td", { class: "num" }, jw.percent(job.cpu_percent)),
    jw.el("td", { class: "num" }, jw.bytes(job.rss_bytes)),
    jw.el("td", { class: "prog" }, jw.progressCell(job.progress, job.state === "running")),
    verdict(job),
    jw.el("td", {}, jw.time(job.started_at)),
    jw.el("td", { class: "cmd", title: job.command.join(" ") }, job.command.join(" ")));
}

// The run's verdict: its rule, its title on hover (an ended run's root cause, a running one's current finding)
function verdict(job) {
  if (!job.finding) return jw.el("td", { class: "verdict" });
  return jw.el("td", { class: "verdict", title: job.finding_title || job.finding, "data-rule": job.finding },
    `[${job.finding}]`);
}

async function refresh() {
  try {
    const jobs = await jw.get("/api/v1/jobs");
    const showEnded = document.getElementById("show-ended").checked;
    const shown = jobs.filter((j) => showEnded || !["succeeded", "failed", "stopped"].includes(j.state));
    shown.sort((a, b) => b.id - a.id);
    document.querySelector("#jobs tbody").replaceChildren(...shown.map(row));
    document.getElementById("empty").hidden = jobs.length > 0;
    const counts = {};
    for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
    document.getElementById("counts").textContent =
      Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(" · ");
    jw.showError("");
    jw.stamp();
  } catch (e) {
    jw.showError(`cannot read the jobs: ${e.message}`);
  }
}

document.getElementById("show-ended").addEventListener("change", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
