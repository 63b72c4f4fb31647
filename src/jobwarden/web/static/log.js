// A run's whole log as a terminal shows it (ansi.js): read in pieces by byte offset, up to MAX_BYTES
// (a browser tab holds so much and no more: the download link has the rest), searchable.
"use strict";

const JOB = document.body.dataset.job;
const RUN_Q = new URLSearchParams(location.search).get("run");
const RUN_P = RUN_Q ? `run=${encodeURIComponent(RUN_Q)}&` : "";
const API = `/api/v1/jobs/${encodeURIComponent(JOB)}`;
const MAX_BYTES = 32 << 20;
const MAX_LINES = 200000;

async function load() {
  const view = new LogView(document.getElementById("log"), MAX_LINES);
  const state = document.getElementById("log-state");
  document.getElementById("download-log").href = `${API}/log${RUN_Q ? `?run=${encodeURIComponent(RUN_Q)}` : ""}`;
  if (RUN_Q) document.getElementById("job-link").href += `?run=${encodeURIComponent(RUN_Q)}`;
  searchBox(view, document.getElementById("log-search"), document.getElementById("log-hits"));
  let offset = 0;
  try {
    for (;;) {
      const piece = await jw.get(`${API}/log?${RUN_P}offset=${offset}`);
      if (piece.text) view.append(piece.text);
      state.textContent = `${jw.bytes(piece.next_offset)} of ${jw.bytes(piece.size)}`;
      if (piece.next_offset <= offset || piece.next_offset >= piece.size) break;
      offset = piece.next_offset;
      if (offset >= MAX_BYTES) {
        state.textContent = `the first ${jw.bytes(offset)} of ${jw.bytes(piece.size)}: download it for the rest`;
        break;
      }
    }
    view.box.dataset.loaded = String(offset);
  } catch (e) {
    jw.showError(`cannot read the log: ${e.message}`);
  }
}

load();
