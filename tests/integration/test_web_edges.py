"""The edges of issue 20 for `jobwarden web`: its sessions (item 5), a server that cannot be worn down (6),
its token file (7), its own log (3) and a SIGTERM as it starts. Each test here failed before its fix. They
run the real command in its own process, as a user would, and speak to it over plain sockets."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import platform
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import CLONE, Jobwarden, venv_pip
from tests.integration.webprocess import WebProcess, get, raw_request
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration


def session_of(web: WebProcess) -> tuple[str, str]:
    """The cookie (name, value) a browser gets for the printed address."""
    answer = get(web, f"/?token={web.token}")
    assert answer.status == 303, answer
    name, _, value = answer.header("Set-Cookie")[0].split(";")[0].partition("=")
    return name, value


def api(web: WebProcess, headers: dict[str, str]) -> int:
    return get(web, "/api/v1/jobs", headers).status


# --- sessions (item 5) --------------------------------------------------------------------------------


def test_a_token_in_the_address_is_checked_before_any_cookie_is_set(jw: Jobwarden) -> None:
    with WebProcess(jw, "--port", "0") as web:
        name, value = session_of(web)
        cookie = {"Cookie": f"{name}={value}"}
        # a page on another local port sends the user, cookie and all, to an address of its making
        for query in ("x%0D%0ASet-Cookie:%20evil=1%0D%0AX-Evil:%201", "wrong", "%E2%82%AC"):
            answer = get(web, f"/?token={query}", cookie)
            assert answer.status == 401, (query, answer)
            assert answer.header("Set-Cookie") == [] and answer.header("X-Evil") == [], answer.head
        assert api(web, cookie) == 200  # not locked out
        good = get(web, f"/?token={web.token}&x=%0D%0AX-Evil:%201")
        assert good.status == 303 and good.header("X-Evil") == [] and "%0D%0A" in good.header("Location")[0]


def test_the_session_cookie_is_not_the_token_and_is_named_per_server(jw: Jobwarden, tmp_path: Path) -> None:
    other = Jobwarden(tmp_path / "other-home", tmp_path)
    with WebProcess(jw, "--port", "0") as web, WebProcess(other, "--port", "0") as second:
        name, value = session_of(web)
        assert web.token not in value and web.token not in name
        for header in (f"Bearer {value}", f"token {value}"):  # what another port received is no token
            assert api(web, {"Authorization": header}) == 401
        assert api(web, {"Cookie": f"{name}={value}"}) == 200
        second_name, second_value = session_of(second)
        assert second_name != name  # two dashboards on one host: neither overwrites the other's
        both = {"Cookie": f"{name}={value}; {second_name}={second_value}"}
        assert api(web, both) == 200 and api(second, both) == 200


def test_the_printed_address_wins_and_odd_cookies_of_other_apps_are_skipped(jw: Jobwarden) -> None:
    with WebProcess(jw, "--port", "0") as web:
        name, value = session_of(web)
        stale = get(web, f"/?token={web.token}", {"Cookie": f"{name}=stale-from-an-earlier-token"})
        assert stale.status == 303 and stale.header("Set-Cookie")  # the address wins over the cookie
        for odd in ("other_app[pref]=dark mode", 'quoted="unterminated', "é=1", "=novalue; novalue", ";;"):
            assert api(web, {"Cookie": f"{odd}; {name}={value}"}) == 200, odd
            assert api(web, {"Cookie": f"{name}={value}; {odd}"}) == 200, odd


# --- a server that cannot be worn down (item 6) ----------------------------------------------------------


def test_idle_connections_never_keep_a_client_out(jw: Jobwarden) -> None:
    """A slowloris bounded by the process's file limit (256 here; 1,024 is a common default): past it the
    server used to fail in accept() and serve nobody."""
    idle: list[socket.socket] = []
    with WebProcess(jw, "--port", "0", nofile=256) as web:
        try:
            for i in range(400):  # half send nothing, half the start of a request and no more
                sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
                if i % 2:
                    sock.sendall(b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n")
                idle.append(sock)
            answer = raw_request(web.port, _request(web, "/api/v1/jobs"), timeout=30)
            assert answer.status == 200, answer
        finally:
            for sock in idle:
                sock.close()
    assert "closed the longest idle" in web.stderr()
    assert "out of system resource" not in web.stderr()  # the cap kept accept() under the file limit


def test_a_request_head_must_arrive_in_time(jw: Jobwarden) -> None:
    """A byte every 0.2 s used to hold a connection (and a thread) for ever."""
    with WebProcess(jw, "--port", "0") as web, socket.create_connection(("127.0.0.1", web.port)) as sock:
        sock.sendall(b"GET /api/v1/jobs HTTP/1.1\r\n")
        start, closed = time.monotonic(), False
        while not closed and time.monotonic() - start < 60:
            if select.select([sock], [], [], 0.2)[0]:
                closed = sock.recv(65536) == b""  # the server gave up on us
            elif not closed:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X")  # another byte of a header that never ends
        assert closed, "the connection is still open after 60 s"
        assert 5 < time.monotonic() - start < 40  # the head deadline (10 s), not sooner, not never
        assert raw_request(web.port, _request(web, "/api/v1/jobs")).status == 200


def _request(web: WebProcess, path: str, extra: str = "", version: str = "HTTP/1.1") -> bytes:
    head = f"GET {path} {version}\r\nHost: {web.host_header}\r\nAuthorization: token {web.token}\r\n"
    return f"{head}{extra}Connection: close\r\n\r\n".encode("latin-1")


BAD_QUERIES = [
    ("/api/v1/jobs/1/log?offset=1e23", "offset"),
    ("/api/v1/jobs/1/log?offset=100000000000000000000000", "offset"),
    ("/api/v1/jobs/1/log?offset=%D9%A1%D9%A2", "offset"),  # Arabic-Indic digits: int() takes them
    ("/api/v1/jobs/1/log/stream?offset=%C2%B2", "offset"),  # '²': isdigit() yes, int() no
    ("/api/v1/jobs/1/log?tail=-3", "tail"),
    ("/api/v1/jobs/1/samples?since=nan", "since"),
    ("/api/v1/jobs/1/samples?since=inf", "since"),
    ("/api/v1/jobs/1/samples?since=1e999", "since"),
    ("/api/v1/jobs/1/samples?points=1_000", "points"),
    ("/api/v1/jobs/1?run=%EF%BC%91", "run"),  # a fullwidth 1
    ("/api/v1/jobs/1?run=1&%FF=2", "query"),  # not UTF-8
]


def test_bad_input_is_a_400_naming_it(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "sh", "-c", "echo hello", check=True)
    with WebProcess(jw, "--port", "0") as web:
        for path, name in BAD_QUERIES:
            answer = raw_request(web.port, _request(web, path))
            assert answer.status == 400, (path, answer)
            assert json.loads(answer.body)["error"].startswith(f"{name}:"), (path, answer.body)
        stream = _request(web, "/api/v1/jobs/1/log/stream", extra="Last-Event-ID: \u00b2\r\n")
        assert raw_request(web.port, stream).status == 400
        for version in ("HTTP/2.0", "HTTP/1.1.1", "HTTQ/1.1"):
            answer = raw_request(web.port, _request(web, "/api/v1/jobs", version=version))
            assert answer.status == 400 and "error" in json.loads(answer.body), (version, answer)
        headers = {"Authorization": f"token {web.token}", "X-Jobwarden": "1"}
        for deep in (b"[" * 60_000, b"[" * 20_000 + b"]" * 20_000):  # json.loads recurses once per level
            answer = get(web, "/api/v1/jobs/1/stop", headers, body=deep)
            assert answer.status == 400 and "nested" in json.loads(answer.body)["error"], answer
        answer = get(web, "/api/v1/jobs/1/stop", headers, body=b"[" * 70_000)
        assert answer.status == 413 and "over 65536 bytes" in json.loads(answer.body)["error"], answer
        name, value = session_of(web)
        for token in ("\u00e9" * 43, "\u20ac"):  # non-ASCII, in the header and beside a good cookie
            bad = raw_request(web.port, _request(web, "/", "").replace(web.token.encode(), token.encode()))
            assert bad.status == 401, bad
            beside = get(web, "/?token=%E2%82%AC", {"Cookie": f"{name}={value}"})
            assert beside.status == 401, beside
        assert raw_request(web.port, _request(web, "/api/v1/jobs/1/log?offset=6")).status == 200
    assert "Traceback" not in web.stderr() and "internal error" not in web.stderr()


def test_the_printed_address_opens(jw: Jobwarden) -> None:
    """As a browser would open it: Host as the URL names it, the port left out when it is 80."""
    forms = [("--host", "0"), ("--host", "0.0.0.0")]
    if _ipv6_loopback():
        forms.append(("--host", "::"))
    for form in forms:
        with WebProcess(jw, *form, "--port", "0") as web:
            host = urlsplit(web.url).hostname or ""
            assert ipaddress.ip_address(host).is_loopback, (form, web.url)
            reply = raw_request(web.port, _request(web, "/api/v1/jobs"), host=host)
            assert reply.status == 200, (form, reply)
            assert "WARNING" in web.stderr()  # not loopback: said so


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        if os.environ.get("CI") == "true":
            pytest.fail("CI machines must have IPv6 loopback (::1) for the --host :: test")
        return False
    return True


@pytest.mark.needs_root
def test_on_port_80_the_address_leaves_the_port_out(jw: Jobwarden) -> None:
    if os.geteuid() != 0:
        unavailable("port 80 needs root")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", 80))
        except OSError as err:
            unavailable(f"port 80 is taken here: {err}")
    with WebProcess(jw, "--port", "80") as web:
        assert web.url == f"http://127.0.0.1/?token={web.token}"
        browser_like = _request(web, "/api/v1/jobs").replace(b"Host: 127.0.0.1:80", b"Host: 127.0.0.1")
        assert raw_request(80, browser_like).status == 200


def test_a_socket_path_too_long_for_sun_path_is_refused_naming_the_limit(
    jw: Jobwarden, tmp_path: Path
) -> None:
    path = tmp_path / ("s" * (120 - len(str(tmp_path))))
    assert len(str(path)) > 108
    result = jw("web", "--socket", str(path))
    assert result.returncode == 2, result
    assert result.stderr.startswith("jobwarden: --socket:") and "108" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not path.exists()


def test_without_the_web_extra_it_says_what_to_install(jw: Jobwarden, tmp_path: Path) -> None:
    broken = tmp_path / "no-uvicorn"
    (broken / "uvicorn").mkdir(parents=True)
    (broken / "uvicorn" / "__init__.py").write_text("raise ImportError('uvicorn is not installed')\n")
    jw.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(broken), jw.env.get("PYTHONPATH")]))
    result = jw("web", "--socket", str(tmp_path / "nowhere" / "web.sock"), cwd=CLONE)
    assert result.returncode == 1, result
    assert f"  {venv_pip()} install -e '.[web]'\n" in result.stderr and "Traceback" not in result.stderr


# --- web.token (item 7) -------------------------------------------------------------------------------


def _plant(home: Path, kind: str) -> Path:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / "web.token"
    elsewhere = home.parent / "someone-elses-file"
    if kind == "symlink to a file":
        elsewhere.write_text("A" * 43 + "\n")  # reads as a token: it would be printed as ours
        path.symlink_to(elsewhere)
    elif kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("symlink to a file", "a symbolic link"),
        ("symlink to /dev/zero", "a symbolic link"),
        ("FIFO", "a FIFO"),
        ("directory", "a directory"),
    ],
)
def test_a_token_file_that_is_no_file_is_refused(jw: Jobwarden, kind: str, said: str) -> None:
    path = _plant(jw.home, kind)
    try:
        result = jw("web", "--port", "0", timeout=30)  # a FIFO once hung it here for ever
    except subprocess.TimeoutExpired:
        pytest.fail(f"jobwarden web hung on a web.token that is a {kind}")
    assert result.returncode == 2, result
    assert result.stdout == ""  # no address, no token printed
    assert result.stderr.startswith(f"jobwarden: refusing {path}: "), result.stderr
    assert said in result.stderr.splitlines()[0] and "not taken as the web token" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_huge_token_file_is_replaced_not_read(jw: Jobwarden) -> None:
    jw.home.mkdir(mode=0o700, parents=True)
    path = jw.home / "web.token"
    with open(path, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.truncate(64 << 20)  # 64 MiB of NUL bytes (sparse): it used to be read whole, and printed
    with WebProcess(jw, "--port", "0") as web:
        assert 43 <= len(web.token) < 100 and "\0" not in web.token
        assert path.read_text().strip() == web.token and (path.stat().st_mode & 0o777) == 0o600


# --- the server's own log (item 3) -------------------------------------------------------------------


def test_the_server_log_passes_on_no_escape_of_a_client(jw: Jobwarden) -> None:
    with WebProcess(jw, "--port", "0") as web:
        raw_request(web.port, b"GET /\x1b]0;pwned\x07/\x1b[2J HTTP/1.1\r\nHost: x\r\n\r\n")
        raw_request(web.port, _request(web, "/nothing/\x1b]52;c;cHduZWQ=\x07"))
        post = _request(web, "/api/v1/jobs/1/stop", "X-Jobwarden: 1\r\nOrigin: http://\x9b2J\x1b]0;x\x07\r\n")
        raw_request(web.port, post.replace(b"GET", b"POST", 1))
    log = web.stderr()
    assert log, "the refusals are logged"
    assert not {"\x1b", "\x07", "\x9b"} & set(log), repr(log)
    assert web.token not in log


# --- a SIGTERM as it starts ----------------------------------------------------------------------------

WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}


def test_a_sigterm_the_moment_the_address_is_printed_stops_it_cleanly(jw: Jobwarden) -> None:
    """Deterministic: stdout is a full pipe, so the server blocks writing its address; the signal comes
    while it does. The handler used to be installed only after the address was printed."""
    number = WRITE_SYSCALL.get(platform.machine())
    if number is None:
        pytest.skip(f"the write system call's number on {platform.machine()} is not known here")
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 4096)  # full: the next write blocks
    os.set_blocking(write_end, True)
    web = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "web", "--port", "0"], env=jw.env, stdout=write_end,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write_end)
    try:

        def blocked() -> bool:
            assert web.poll() is None, "the server ended before it blocked on its address"
            return _writing_to_stdout(web.pid, number)

        # polling /proc: there is no handshake with a process stuck in write()
        eventually("blocked on writing its address", blocked, 60, every_s=0.01)
        web.send_signal(signal.SIGTERM)
        output = b""
        while chunk := os.read(read_end, 1 << 16):  # the address gets through, then the server stops
            output += chunk
        assert web.wait(timeout=30) == 0
        assert b"/?token=" in output
    finally:
        if web.poll() is None:
            web.kill()
            web.wait()
        os.close(read_end)


def _writing_to_stdout(pid: int, number: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == str(number) and int(fields[1], 16) == 1


# --- a malformed sample row (item 8, where the web serves it) ---------------------------------------------

MALFORMED = [
    ("samples", "cpu_percent = 'abc'"),
    ("samples", "rss_bytes = 1e400"),  # REAL infinity
    ("samples", "gpus = '{'"),
    ("samples", "gpus = '[[1, 2]]'"),
    ("samples_rollup", "cpu_avg = x'00ff'"),
    ("samples_rollup", "gpus = '[[0, \"busy\", 1, 2]]'"),
]


def test_a_malformed_sample_row_is_skipped_by_every_page_that_charts_samples(jw: Jobwarden) -> None:
    job = jw.start(sys.executable, "-c", "import time; [time.sleep(0.5) for _ in range(6)]")
    jw("wait", str(job["id"]))
    database = sqlite3.connect(jw.home / "jobwarden.db")
    with database:
        rows = database.execute("SELECT at FROM samples ORDER BY at").fetchall()
        assert len(rows) >= 2, "the job was sampled"
        for table, change in MALFORMED:  # one row of each table gets every defect in turn, kept
            database.execute(f"UPDATE {table} SET {change} WHERE at = (SELECT MIN(at) FROM {table})")
    database.close()
    with WebProcess(jw, "--port", "0") as web:
        auth = {"Authorization": f"token {web.token}"}
        for path in ("/api/v1/jobs", "/api/v1/jobs/1", "/api/v1/jobs/1/samples", "/metrics"):
            answer = get(web, path, auth)
            assert answer.status == 200, (path, answer)
        samples = json.loads(get(web, "/api/v1/jobs/1/samples", auth).body)
        assert len(samples) >= 1  # the sound rows are still charted
    assert "internal error" not in web.stderr()
