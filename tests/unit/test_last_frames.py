"""`logs` into a pipe: each line as its last frame, fed in chunks cut anywhere (cli.joboutput.LastFrames)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobwarden.cli.joboutput import HELD_MAX, LastFrames, last_frame_bytes


def piped(chunks: list[bytes]) -> bytes:
    frames = LastFrames()
    return b"".join(frames.feed(chunk) for chunk in chunks) + frames.close()


def test_a_redrawn_line_is_its_last_frame_and_a_crlf_is_kept() -> None:
    assert last_frame_bytes(b" 10%\r 50%\r100%") == b"100%"
    assert last_frame_bytes(b"windows line\r") == b"windows line\r"
    assert last_frame_bytes(b"a\rb\r") == b"b\r"
    assert last_frame_bytes(b"") == b""


def test_a_line_cut_between_reads_is_held_until_its_newline() -> None:
    frames = LastFrames()
    assert frames.feed(b"epoch 1 \r 10%") == b""
    assert frames.feed(b"\r 90%\nnext") == b" 90%\n"
    assert frames.close() == b"next"


def test_a_bar_that_never_ends_its_line_holds_little() -> None:
    frames = LastFrames()
    for i in range(2000):
        assert frames.feed(f"\r{i:>6}% {'#' * 60}".encode()) == b""
    assert len(frames.held) <= HELD_MAX
    assert frames.close() == f"  1999% {'#' * 60}".encode()


@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"bc", b"\x1b[31m", b"\r\n"]), max_size=40), st.data())
def test_the_cut_between_reads_changes_nothing(pieces: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    whole = b"\n".join(last_frame_bytes(line) for line in stream.split(b"\n"))
    assert piped(chunks) == whole
