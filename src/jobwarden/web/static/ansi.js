// A job's output as a terminal shows it, for the job page's log and the full-log page: SGR colours
// (ECMA-48 "Select Graphic Rendition": ESC [ ... m) become styled spans, every other escape sequence and
// control character is dropped, a line redrawn with \r (a progress bar) shows as its last frame. Each
// piece of job text becomes a text node: no byte the job wrote is ever parsed as HTML.
"use strict";

const ansi = (() => {
  // jobwarden.text.sanitize's patterns, the same in both places so that the page shows what `logs` and
  // `top` show: SGR (its parameters captured), any other CSI (ESC [ or C1 CSI), a string sequence (OSC,
  // DCS, SOS, PM, APC) through its terminator, any other escape sequence, a lone control character but
  // tab (and newline, split off before)
  const UNSAFE = new RegExp([
    "(?:\x1b\\[|\x9b)([0-9;:]*)m",
    "(?:\x1b\\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]",
    "(?:\x1b[\\]PX^_]|[\x90\x98\x9d\x9e\x9f])[\\s\\S]*?(?:\x07|\x1b\\\\|\x9c)",
    "\x1b[\x20-\x2f]*[\x30-\x7e]",
    "[\x00-\x08\x0b-\x1f\x7f-\x9f]",
  ].join("|"), "g");

  function fresh() {
    return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false, strike: false };
  }

  // xterm's 256 colours: 16 named (CSS classes), a 6×6×6 cube, 24 greys
  function colour256(n) {
    if (n < 16) return n;
    if (n < 232) {
      const c = n - 16, level = (v) => (v === 0 ? 0 : 55 + v * 40);
      return `rgb(${level(Math.floor(c / 36))},${level(Math.floor(c / 6) % 6)},${level(c % 6)})`;
    }
    const g = 8 + (n - 232) * 10;
    return `rgb(${g},${g},${g})`;
  }

  // an extended colour (38;5;n or 38;2;r;g;b): the colour and how many parameters it used
  function extended(params, i) {
    if (params[i + 1] === 5 && params.length > i + 2) return [colour256(Math.min(255, params[i + 2])), 2];
    if (params[i + 1] === 2 && params.length > i + 4) {
      const [r, g, b] = params.slice(i + 2, i + 5).map((v) => Math.min(255, v));
      return [`rgb(${r},${g},${b})`, 4];
    }
    return [null, params.length]; // malformed: the rest of the sequence is ignored, as xterm does
  }

  function apply(state, raw) {
    const params = raw === "" ? [0] : raw.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p) || 0));
    for (let i = 0; i < params.length; i++) {
      const p = params[i];
      if (p === 0) Object.assign(state, fresh());
      else if (p === 1) state.bold = true;
      else if (p === 2) state.dim = true;
      else if (p === 3) state.italic = true;
      else if (p === 4) state.underline = true;
      else if (p === 7) state.inverse = true;
      else if (p === 9) state.strike = true;
      else if (p === 22) state.bold = state.dim = false;
      else if (p === 23) state.italic = false;
      else if (p === 24) state.underline = false;
      else if (p === 27) state.inverse = false;
      else if (p === 29) state.strike = false;
      else if (p >= 30 && p <= 37) state.fg = p - 30;
      else if (p >= 90 && p <= 97) state.fg = p - 90 + 8;
      else if (p === 39) state.fg = null;
      else if (p >= 40 && p <= 47) state.bg = p - 40;
      else if (p >= 100 && p <= 107) state.bg = p - 100 + 8;
      else if (p === 49) state.bg = null;
      else if (p === 38 || p === 48) {
        const [colour, used] = extended(params, i);
        if (colour !== null) state[p === 38 ? "fg" : "bg"] = colour;
        i += used;
      }
    }
  }

  function styled(text, state) {
    const plain = state.fg === null && state.bg === null && !state.bold && !state.dim && !state.italic &&
      !state.underline && !state.inverse && !state.strike;
    if (plain) return document.createTextNode(text);
    const span = document.createElement("span");
    span.textContent = text;
    let [fg, bg] = state.inverse ? [state.bg, state.fg] : [state.fg, state.bg];
    if (state.inverse) span.classList.add("ansi-inverse");
    if (state.bold && typeof fg === "number" && fg < 8) fg += 8; // bold as bright, as most terminals
    if (typeof fg === "number") span.classList.add(`ansi-fg-${fg}`);
    else if (fg) span.style.color = fg; // CSSOM, allowed by the page's policy (no style attribute parsed)
    if (typeof bg === "number") span.classList.add(`ansi-bg-${bg}`);
    else if (bg) span.style.backgroundColor = bg;
    for (const k of ["bold", "dim", "italic", "underline", "strike"]) if (state[k]) span.classList.add(`ansi-${k}`);
    return span;
  }

  // The text a terminal leaves on a line redrawn with \r: the last frame (a \r at its very end is a
  // frame not yet drawn over, so the one before it stands)
  function lastFrame(line) {
    const body = line.replace(/\r+$/, "");
    const i = body.lastIndexOf("\r");
    return i < 0 ? ["", body] : [body.slice(0, i), body.slice(i + 1)];
  }

  // One line's nodes; `state` (the colours in force) carries on to the next line, as in a terminal.
  function render(line, state) {
    const [before, shown] = lastFrame(line);
    for (const m of before.matchAll(UNSAFE)) if (m[1] !== undefined) apply(state, m[1]); // colours set by drawn-over frames still hold
    const nodes = [];
    let at = 0;
    for (const m of shown.matchAll(UNSAFE)) {
      if (m.index > at) nodes.push(styled(shown.slice(at, m.index), state));
      if (m[1] !== undefined) apply(state, m[1]);
      at = m.index + m[0].length;
    }
    if (at < shown.length) nodes.push(styled(shown.slice(at), state));
    return nodes;
  }

  // The text render() shows of a line, for the tests: jobwarden.text.sanitize's terminal_text(last_frame())
  function text(line) {
    return render(line, fresh()).map((n) => n.textContent).join("");
  }

  return { fresh, render, lastFrame, apply, text };
})();

// A log on a page: lines appended as they come (an unfinished last line redrawn as it grows), at most
// `maxLines` kept in the DOM, and a search that marks the matching lines.
class LogView {
  constructor(box, maxLines) {
    this.box = box;
    this.maxLines = maxLines;
    this.state = ansi.fresh(); // colours in force after the last complete line
    this.partial = null; // the raw text of an unfinished last line
    this.query = "";
    this.hits = []; // the lines found, in order, and which of them is shown
    this.at = -1;
  }

  append(text) {
    const stick = this.box.scrollTop + this.box.clientHeight >= this.box.scrollHeight - 8;
    const parts = text.split("\n");
    const complete = parts[parts.length - 1] === "";
    if (complete) parts.pop();
    parts.forEach((part, i) => {
      let raw = part;
      if (i === 0 && this.partial !== null && this.box.lastChild) {
        raw = this.partial + part;
        this.box.lastChild.remove();
      }
      const last = i === parts.length - 1 && !complete;
      const state = last ? { ...this.state } : this.state; // an unfinished line is drawn again from here
      const div = document.createElement("div");
      div.append(...ansi.render(raw, state));
      if (this.query && this.matches(div)) div.classList.add("hit");
      this.box.append(div);
      this.partial = last ? raw : null;
    });
    if (complete) this.partial = null;
    while (this.box.childElementCount > this.maxLines) this.box.firstChild.remove();
    if (stick) this.box.scrollTop = this.box.scrollHeight;
  }

  matches(div) {
    return div.textContent.toLowerCase().includes(this.query);
  }

  // Marks the lines holding `query` (any case); returns how many. Pressed again: the next one.
  search(query) {
    const q = query.trim().toLowerCase();
    if (q !== this.query) {
      this.query = q;
      for (const div of this.box.children) {
        div.classList.toggle("hit", q !== "" && this.matches(div));
        div.classList.remove("current");
      }
    }
    // lines came and went since: count again, go on from the current one
    const current = this.box.querySelector("div.current");
    this.hits = Array.from(this.box.querySelectorAll("div.hit"));
    this.at = current ? this.hits.indexOf(current) : -1;
    if (this.hits.length) {
      if (current) current.classList.remove("current");
      this.at = (this.at + 1) % this.hits.length;
      const div = this.hits[this.at];
      div.classList.add("current");
      this.box.scrollTop = div.offsetTop - this.box.offsetTop - this.box.clientHeight / 3;
    }
    return this.hits.length;
  }
}

// The search box beside a log: Enter finds the next line, the count says how many there are.
function searchBox(view, input, count) {
  const go = () => {
    const n = view.search(input.value);
    count.textContent = input.value.trim() ? `${n ? view.at + 1 : 0} of ${n} line${n === 1 ? "" : "s"}` : "";
  };
  input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); go(); } });
  input.addEventListener("search", go);
}
