"""Text a job wrote, made safe for a user's terminal: the one sanitiser every frontend and log line uses.

A job's bytes reach a user through `logs`, `status` (command lines, cwd), `explain` (exception text), `top`,
`ps` and the web server's own log. Written raw, they drive the terminal: OSC sets the window title or, with
OSC 52, the clipboard; CSI moves the cursor and clears the screen, so a line can hide another or forge
jobwarden's own output. What is removed here (ECMA-48):

- CSI sequences (`ESC [` or C1 CSI, parameters, intermediates, a final byte), SGR colours included unless
  the caller keeps them (`colours=True`: `logs` on a terminal, like `less -R`);
- string sequences, OSC, DCS, SOS, PM and APC (`ESC ]`, `ESC P`, `ESC X`, `ESC ^`, `ESC _` or their C1
  bytes), through their terminator (BEL, `ESC \\` or C1 ST);
- every other escape sequence (`ESC` with intermediates and a final byte: `ESC c` resets the terminal);
- every other C0 and C1 control character but newline and tab; a carriage return only where the caller
  keeps redraws (`carriage_returns=True`: a progress bar followed live).

C1 controls (U+0080-U+009F) count: some terminals read U+009B as CSI. Bidirectional controls (U+202A-U+202E,
U+2066-U+2069, U+200E/U+200F, U+061C) reorder what follows them on the line ("Trojan Source",
CVE-2021-42574): a command line or a frame's file name could show as something else. They are not removed
but escaped, shown as `<U+202E>`, so that a reader sees they were there. `TerminalStream` does the same on a
byte stream whose sequences may be cut between two reads.
"""

from __future__ import annotations

import codecs
import re

# What a complete sequence or control character looks like; SGR first so that it can be kept.
_SEQUENCE = (
    r"(?P<sgr>(?:\x1b\[|\x9b)[0-9;:]*m)"
    r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"  # other CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c)"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]"  # any other escape sequence
)
_CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"  # neither \t, \n nor \r
# Each begins with a control character: said first, as a lookahead, so that the engine skips the plain text
# between them in one scan instead of trying every alternative at every character (3x faster on a log
# coloured throughout)
_UNSAFE = re.compile(f"(?=[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f])(?:{_SEQUENCE}|{_CONTROLS}|\\r)", re.DOTALL)
_UNSAFE_KEEP_CR = re.compile(
    f"(?=[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f])(?:{_SEQUENCE}|{_CONTROLS})", re.DOTALL
)
# The start of a sequence whose end has not come yet (a stream cut it) is held back until it has
_STRING_START = re.compile(r"\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]")  # ends only at its terminator
# a CSI or escape sequence still without its final byte
_UNFINISHED = re.compile(r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*|\x1b[\x20-\x2f]*")
# Bidirectional formatting characters: embeddings and overrides, isolates, marks, the Arabic letter mark
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
MAX_HELD = 4096  # an unterminated sequence longer than this is not held back any more: it is cleaned as text


def terminal_text(text: str, colours: bool = False, carriage_returns: bool = False) -> str:
    """`text` without anything that would drive a terminal (see the module's docstring)."""
    if text.isprintable():  # nearly always: one C call
        return text
    unsafe = _UNSAFE_KEEP_CR if carriage_returns else _UNSAFE
    kept = unsafe.sub(lambda m: m.group("sgr") or "", text) if colours else unsafe.sub("", text)
    return _BIDI.sub(_visible_codepoint, kept)


def _visible_codepoint(match: re.Match[str]) -> str:
    return f"<U+{ord(match.group()):04X}>"


def one_line(text: str) -> str:
    """A field shown on one line (a command, a path, an exception's message): safe, newlines and tabs as
    spaces, so that a multi-line command cannot break a table or forge a line of its own."""
    if text.isprintable():
        return text
    return " ".join(terminal_text(text).split("\n")).replace("\t", " ")


def last_frame(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a progress bar): its last frame. A
    carriage return that ends the line (CRLF) draws nothing."""
    frames = line.rstrip("\r").rsplit("\r", 1)
    return frames[-1]


class TerminalStream:
    """`terminal_text` over a byte stream (`logs -f`): UTF-8 decoded across reads, and a sequence cut by a
    read held back until its end arrives, so that no half of one reaches the terminal."""

    def __init__(self, colours: bool = False, carriage_returns: bool = False) -> None:
        self.colours = colours
        self.carriage_returns = carriage_returns
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""

    def feed(self, data: bytes) -> str:
        text = self._held + self._decoder.decode(data)
        cut = _partial_from(text)
        text, self._held = text[:cut], text[cut:]
        return terminal_text(text, self.colours, self.carriage_returns)

    def close(self) -> str:
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return terminal_text(text, self.colours, self.carriage_returns)


def _partial_from(text: str) -> int:
    """Where an unfinished sequence at the end of `text` begins; len(text) when there is none. Only a
    string sequence can hold other introducers (the ESC of its ST): the first one opened after the last
    terminator is unfinished; else the last introducer, if a CSI or escape sequence still lacks its end."""
    start = max(0, len(text) - MAX_HELD)
    st = text.rfind("\x1b\\", start)
    ended = max(text.rfind("\x07", start), st + 1 if st >= 0 else -1, text.rfind("\x9c", start))
    opened = _STRING_START.search(text, max(start, ended + 1))
    if opened:
        return opened.start()
    last = max(text.rfind("\x1b", start), text.rfind("\x9b", start))
    if last >= 0 and _UNFINISHED.fullmatch(text, last):
        return last
    return len(text)
