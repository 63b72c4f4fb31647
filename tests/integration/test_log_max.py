"""`--log-max`: a job that prints 1 GiB keeps a log within its cap on disk, with its head and newest tail,
and every reader says what was dropped (issue 21). The job writes its own fd all along: the shim frees
the middle behind it (a hole, store/logfiles.py)."""

from __future__ import annotations

import os

import pytest

from jobwarden.store.logfiles import data_spans
from tests.conftest import Jobwarden

pytestmark = pytest.mark.integration
GIB = 1 << 30
CAP = 64 << 20
LINE = "0123456789" * 9 + "abcdefghi"  # 99 characters and a newline: 100 bytes a line


def test_a_job_that_prints_1_gib_keeps_its_head_and_tail_within_the_cap(jw: Jobwarden) -> None:
    script = f'echo FIRST; yes "{LINE}" | head -c {GIB}; echo; echo LAST'
    result = jw("run", "-w", "--log-max", "64M", "--", "sh", "-c", script, timeout=600)
    assert result.returncode == 0, result.stderr
    log = jw.home / "jobs" / "1" / "run-1" / "output.log"
    st = os.stat(log)
    assert st.st_size == len("FIRST\n") + GIB + len("\nLAST\n")  # the length and every offset are kept
    assert st.st_blocks * 512 <= CAP  # on disk: within the cap
    with open(log, "rb") as fh:
        spans = data_spans(fh.fileno(), 0, st.st_size)
    head, tail = spans[0], spans[-1]
    assert len(spans) == 2 and head[0] == 0 and tail[1] == st.st_size
    assert head[1] == CAP // 4 and st.st_size - tail[0] >= CAP // 2  # a quarter kept first, a half last

    status = jw.status(1)
    dropped = status["log_dropped"]
    assert dropped["start"] == head[1] and dropped["end"] == tail[0]
    assert dropped["bytes"] == tail[0] - head[1] > GIB - CAP and dropped["max_bytes"] == CAP
    said = [line for line in jw("status", "1").stdout.splitlines() if "log dropped" in line]
    assert said and "to keep the log within --log-max 64.0M" in said[0]

    out = jw("logs", "1", timeout=300).stdout
    lines = out.splitlines()
    assert lines[:2] == ["FIRST", LINE] and lines[-1] == "LAST"
    markers = [line for line in lines if line.startswith("[jobwarden:")]
    assert markers == [
        "[jobwarden: " + _size(dropped["bytes"]) + " of output dropped here to keep the log within --log-max]"
    ]
    assert "\0" not in out  # never the hole's zeros
    assert len(out) < 2 * CAP
    assert jw("logs", "-n", "1", "1").stdout == "LAST\n"
    assert not any(f["rule"] == "disk-full" for f in status["findings"])


def _size(n: int) -> str:
    from jobwarden.config import format_size

    return format_size(n)


def test_a_cap_too_small_to_keep_a_head_and_tail_is_refused(jw: Jobwarden) -> None:
    result = jw("run", "--log-max", "100K", "--", "true")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        "jobwarden: --log-max 100K is only 100.0K: the log keeps its head and its tail"
    )


def test_the_web_serves_a_trimmed_log_with_its_marker_never_its_hole(jw: Jobwarden) -> None:
    """The download, the pages by offset and the tail: the freed middle is one marker line, never its
    zeros, and a download's Content-Length holds (web/asgi.py sends what logfiles.output_length says)."""
    from tests.integration.webtools import Client, web_server

    script = f'echo FIRST; yes "{LINE}" | head -c {32 << 20}; echo; echo LAST'
    assert jw("run", "-w", "--log-max", "4M", "--", "sh", "-c", script, timeout=300).returncode == 0
    with web_server(jw.home) as served:
        client = Client(served)
        whole = client.get("/api/v1/jobs/1/log")  # http.client checks the body against Content-Length
        assert whole.status == 200 and b"\0" not in whole.body
        text = whole.body.decode()
        assert text.startswith(f"FIRST\n{LINE}\n") and text.endswith("\nLAST\n")
        assert text.count("of output dropped here to keep the log within --log-max]") == 1
        paged, offset = [], 0
        size = client.get("/api/v1/jobs/1/log?offset=0&limit=65536").json()["size"]
        while offset < size:  # the page's "older" button walks the log by offsets
            piece = client.get(f"/api/v1/jobs/1/log?offset={offset}&limit=1048576").json()
            assert piece["next_offset"] > offset
            paged.append(piece["text"])
            offset = piece["next_offset"]
        assert "".join(paged) == text
        assert client.get("/api/v1/jobs/1/log?tail=1").body == b"LAST\n"
