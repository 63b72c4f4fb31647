"""The one sanitiser of job text for terminals: what it removes, what it keeps, and that a stream cut
anywhere comes out as the whole text would (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.text.sanitize import MAX_HELD, TerminalStream, last_frame, one_line, terminal_text

ATTACKS = {
    "window title": "\x1b]0;pwned\x07",
    "clipboard (OSC 52)": "\x1b]52;c;ZWNobyBoaQ==\x1b\\",
    "screen clear": "\x1b[2J\x1b[H",
    "terminal reset": "\x1bc",
    "C1 CSI": "\x9b2J",
    "C1 OSC": "\x9d0;pwned\x9c",
    "DCS": "\x1bP1$r\x1b\\",
    "cursor up and erase": "\x1b[1A\x1b[2K",
    "bell and backspace": "\x07\x08",
}


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=list(ATTACKS))
def test_what_drives_a_terminal_is_removed(attack: str) -> None:
    assert terminal_text(f"before{attack}after") == "beforeafter"
    assert terminal_text(f"before{attack}after", colours=True) == "beforeafter"


def test_colours_are_kept_only_when_asked() -> None:
    red = "\x1b[31mError\x1b[0m: \x1b[1;38;2;255;0;0mbad\x1b[m"
    assert terminal_text(red) == "Error: bad"
    assert terminal_text(red, colours=True) == red


def test_newlines_and_tabs_stay_carriage_returns_only_when_asked() -> None:
    bar = "\r 10%|#  | 1/10\r 20%|## | 2/10\n"
    assert terminal_text("a\tb\nc") == "a\tb\nc"
    assert terminal_text(bar) == " 10%|#  | 1/10 20%|## | 2/10\n"
    assert terminal_text(bar, carriage_returns=True) == bar


def test_one_line() -> None:
    assert one_line("python -c 'import x\nx.run()'\t--lr 3") == "python -c 'import x x.run()' --lr 3"
    assert one_line("train.py \x1b]0;t\x07--go") == "train.py --go"


def test_the_last_frame_of_a_redrawn_line() -> None:
    assert last_frame("\r 10%|#\r 20%|##\r") == " 20%|##"
    assert last_frame("plain") == "plain"
    assert last_frame("crlf line\r") == "crlf line"


def test_a_sequence_cut_by_a_read_is_held_until_its_end() -> None:
    stream = TerminalStream()
    assert stream.feed(b"ok \x1b]0;pw") == "ok "
    assert stream.feed(b"ned\x1b") == ""
    assert stream.feed(b"\\ then \x1b[3") == " then "
    assert stream.feed(b"1mred\xe2\x82") == "red"
    assert stream.feed(b"\xac") == "€"
    assert stream.close() == ""


def test_an_endless_sequence_is_not_held_for_ever() -> None:
    stream = TerminalStream()
    assert stream.feed(b"\x1b]0;") == ""
    out = stream.feed(b"x" * (MAX_HELD + 10))
    assert out.startswith("0;x") and "\x1b" not in out


FORBIDDEN = {chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}
# the pieces sequences are made of, and a few plain characters around them
PIECES = "aZ \n\t\r\x1b[]0;mP\\\x07\x9b\x9c€\x00\x7f"
job_text = st.text(alphabet=st.sampled_from(list(PIECES)), max_size=60)


@given(job_text)
def test_nothing_that_drives_a_terminal_is_left(text: str) -> None:
    assert not set(terminal_text(text)) & FORBIDDEN
    assert not set(terminal_text(text, carriage_returns=True)) & (FORBIDDEN - {"\r"})


@given(job_text)
def test_kept_colours_are_only_sgr(text: str) -> None:
    kept = terminal_text(text, colours=True)
    assert terminal_text(kept) == terminal_text(text)  # what colours=True adds back is SGR alone


@given(job_text, st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_a_stream_cut_anywhere_reads_as_the_whole(text: str, cuts: list[int]) -> None:
    data = text.encode()
    stream, out, at = TerminalStream(), [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        out.append(stream.feed(data[at:cut]))
        at = cut
    out.append(stream.feed(data[at:]))
    out.append(stream.close())
    assert "".join(out) == terminal_text(text)


# --- the patterns' lookahead changes nothing ------------------------------------------------------------

_NOISY = st.text(
    st.sampled_from(
        [
            "a",
            " ",
            "\n",
            "\r",
            "\t",
            "\x1b",
            "[",
            "]",
            "\\",
            "\x07",
            "\x9b",
            "\x9c",
            "\x9d",
            "0",
            ";",
            "m",
            "2",
            "J",
            "P",
            "_",
            "c",
            "é",
            "\x00",
            "\x7f",
            "\x85",
        ]
    )
)


@given(_NOISY, st.booleans(), st.booleans())
def test_the_lookahead_only_skips_text_faster(text: str, colours: bool, carriage_returns: bool) -> None:
    import re

    from jobwarden.text import sanitize

    plain = f"{sanitize._SEQUENCE}|{sanitize._CONTROLS}" + ("" if carriage_returns else "|\\r")
    reference = re.compile(plain, re.DOTALL)
    expected = reference.sub(lambda m: (m.group("sgr") or "") if colours else "", text)
    assert sanitize.terminal_text(text, colours, carriage_returns) == expected


# --- bidirectional controls ---------------------------------------------------------------------------

BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
BIDI += ["\u200e", "\u200f", "\u061c"]


@pytest.mark.parametrize("mark", BIDI, ids=[f"U+{ord(c):04X}" for c in BIDI])
def test_a_bidi_control_is_escaped_so_it_cannot_reorder_the_line(mark: str) -> None:
    """A right-to-left override in a command line showed `python train.py` for another command: each
    bidi control is shown as its code point, never passed to the terminal."""
    text = f"python {mark}yp.niart"
    shown = f"python <U+{ord(mark):04X}>yp.niart"
    assert terminal_text(text) == shown
    assert terminal_text(text, colours=True, carriage_returns=True) == shown
    assert one_line(text) == shown
    stream = TerminalStream()
    assert stream.feed(text.encode()[:9]) + stream.feed(text.encode()[9:]) + stream.close() == shown


def test_a_frames_file_name_in_a_profile_is_escaped() -> None:
    from jobwarden.text.profile import frame_label

    entry = {"function": "step\u202e", "file": "/srv/\u2066evil.py", "line": 3}
    assert frame_label(entry) == "step<U+202E> (/srv/<U+2066>evil.py:3)"


def test_other_text_in_other_scripts_is_kept() -> None:
    assert terminal_text("שלום مرحبا é ü 日本") == "שלום مرحبا é ü 日本"
