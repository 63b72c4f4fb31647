// The job page's flame graph of the run's newest profile (`jobwarden profile`, or the one taken on a speed
// finding), drawn here as SVG from the stored speedscope samples: one row per stack depth, the whole run at
// the top, then each process (main, DataLoader workers, ranks), then its frames; a frame's width is its
// share of the samples. A click zooms into a frame, a click on the top row zooms out. Every name reaches
// the page as a text node or an attribute value, never as markup.
"use strict";

(() => {
  const JOB = document.body.dataset.job;
  const RUN = new URLSearchParams(location.search).get("run");
  const Q = RUN ? `&run=${encodeURIComponent(RUN)}` : "";
  const API = `/api/v1/jobs/${encodeURIComponent(JOB)}/profile`;
  const SVG = "http://www.w3.org/2000/svg";
  const ROW = 18;
  const REFRESH_MS = 30000;
  const IO_WAIT = "(waiting on I/O)";
  let shownAt = null;

  function node(name, file, line) {
    return { name, file, line, value: 0, children: new Map() };
  }

  // speedscope "sampled" profiles (one per thread, named "pid P tid T name") -> one tree for the run
  function buildTree(speedscope, summary) {
    const frames = speedscope.shared.frames;
    const commands = new Map((summary.processes || []).map((p) => [p.pid, p.command]));
    const root = node(`job ${summary.id} run ${summary.run}: all processes`, "", null);
    for (const prof of speedscope.profiles) {
      const m = /^pid (\d+)/.exec(prof.name || "");
      const pid = m ? Number(m[1]) : 0;
      const key = `process ${pid}`;
      if (!root.children.has(key)) {
        root.children.set(key, node(`pid ${pid}: ${commands.get(pid) || "?"}`, "", null));
      }
      const proc = root.children.get(key);
      prof.samples.forEach((stack, i) => {
        const w = prof.weights[i];
        root.value += w;
        proc.value += w;
        let at = proc;
        for (const index of stack) {
          const f = frames[index];
          // one box per function (and file), whatever line it was on: a flame graph's convention
          const k = `${f.name}\u0000${f.file || ""}`;
          if (!at.children.has(k)) at.children.set(k, node(f.name, f.file || "", f.line || null));
          at = at.children.get(k);
          at.value += w;
        }
      });
    }
    return root;
  }

  function depthOf(n) {
    let d = 0;
    for (const c of n.children.values()) d = Math.max(d, depthOf(c));
    return d + 1;
  }

  function hue(text) {
    let h = 0;
    for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) >>> 0;
    return h;
  }

  function colour(n, depth) {
    if (n.name === IO_WAIT) return "#6cb6ff";
    if (depth < 2) return "#c9d1d9";
    const h = hue(n.file || n.name);
    return `hsl(${10 + (h % 45)}, ${70 + (h % 20)}%, ${58 + (h % 14)}%)`;
  }

  function label(n) {
    return n.file ? `${n.name} (${n.file})` : n.name;
  }

  function shortLabel(n) {
    return n.file ? `${n.name} (${n.file.split("/").pop()})` : n.name;
  }

  function draw(box, root, focus, total) {
    const width = Math.max(300, box.clientWidth || 1000);
    const rows = depthOf(focus) + 1;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", rows * ROW);
    svg.setAttribute("class", "flame");
    svg.setAttribute("role", "img");
    const scale = width / (focus.value || 1);
    const place = (n, x, depth) => {
      const w = n.value * scale;
      if (w < 0.5) return;
      const g = document.createElementNS(SVG, "g");
      g.setAttribute("class", "frame");
      g.setAttribute("data-function", n.name);
      g.setAttribute("data-share", (n.value / total).toFixed(4));
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("x", x.toFixed(1));
      rect.setAttribute("y", depth * ROW);
      rect.setAttribute("width", Math.max(0.5, w - 0.5).toFixed(1));
      rect.setAttribute("height", ROW - 1);
      rect.setAttribute("fill", colour(n, depth));
      const title = document.createElementNS(SVG, "title");
      title.textContent = `${label(n)}: ${(100 * n.value / total).toFixed(1)} % of the samples`;
      g.append(rect, title);
      if (w > 36) {
        const text = document.createElementNS(SVG, "text");
        text.setAttribute("x", (x + 3).toFixed(1));
        text.setAttribute("y", depth * ROW + ROW - 5);
        text.setAttribute("font-size", "11");
        const room = Math.floor((w - 6) / 6.5);
        const name = shortLabel(n);
        text.textContent = name.length > room ? `${name.slice(0, Math.max(1, room - 1))}…` : name;
        g.append(text);
      }
      g.addEventListener("click", () => draw(box, root, n === focus ? root : n, total));
      svg.append(g);
      let cx = x;
      const kids = [...n.children.values()].sort((a, b) => b.value - a.value);
      for (const c of kids) {
        place(c, cx, depth + 1);
        cx += c.value * scale;
      }
    };
    place(focus, 0, 0);
    box.replaceChildren(svg);
  }

  function caption(summary) {
    const p = document.createElement("p");
    p.className = "muted small";
    const io = summary.io_wait_fraction ? `, ${(100 * summary.io_wait_fraction).toFixed(0)} % waiting on I/O` : "";
    p.textContent = `${summary.trigger === "auto" ? "taken on a speed finding" : "jobwarden profile"}, `
      + `${jw.time(summary.at)}: ${summary.samples} samples of `  // the page's one clock, 24-hour
      + `${(summary.processes || []).length} process(es), ${summary.duration_s} s at ${summary.rate_hz} Hz${io}. `
      + "Click a frame to zoom.";
    return p;
  }

  async function fetchJson(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 404) return null;
    if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
    return r.json();
  }

  async function refresh() {
    const section = document.getElementById("flame");
    if (!section) return;
    try {
      const summary = await fetchJson(`${API}?format=summary${Q}`);
      if (!summary) return;
      if (summary.at === shownAt) return;
      const speedscope = await fetchJson(`${API}?format=speedscope${Q}`);
      if (!speedscope) return;
      shownAt = summary.at;
      const graph = document.createElement("div");
      graph.className = "flame-graph";
      section.replaceChildren(caption(summary), graph);
      const root = buildTree(speedscope, summary);
      draw(graph, root, root, root.value || 1);
    } catch (e) {
      const p = document.createElement("p");
      p.className = "error";
      p.textContent = `cannot read the profile: ${e.message}`;
      section.replaceChildren(p);
    }
  }

  function start() {
    refresh();
    setInterval(refresh, REFRESH_MS);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
