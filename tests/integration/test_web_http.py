"""`jobwarden web` over HTTP, against real jobs: who may ask (token, Host, CSRF), what it answers (the
CLI's --json shapes), the log as text, JSON and a resumable event stream, and never the environment."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobwarden.web.app import Limits
from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.integration.webtools import Client, EventReader, web_server

pytestmark = pytest.mark.integration
TICKER = str(Path(__file__).parent / "jobs" / "ticker.py")
FAILING = ("-c", "print('last words', flush=True); raise ValueError('boom')")


def start_ticker(jw: Jobwarden, tmp_path: Path, first: int = 3, *options: str) -> tuple[int, Path]:
    """A running job that waits on its GO FIFO: write "MORE CODE" there to end it."""
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job = jw.start(sys.executable, TICKER, str(ready), str(go), str(first), options=options)
    read_fifo(ready)
    return int(job["id"]), go


def finish(jw: Jobwarden, job_id: int, go: Path, more: int = 0, code: int = 0) -> None:
    write_fifo(go, f"{more} {code}\n")
    jw("wait", str(job_id))


# --- who may ask ------------------------------------------------------------------------------------


def test_every_address_but_healthz_needs_the_token(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "true", check=True)
    with web_server(jw.home) as served:
        client = Client(served)
        for path in ("/", "/jobs/1", "/static/job.js", "/api/v1/jobs", "/api/v1/jobs/1", "/metrics",
                     "/api/v1/jobs/1/log", "/api/v1/jobs/1/log/stream"):  # fmt: skip
            answer = client.request("GET", path)
            assert answer.status == 401, path
            assert b"Traceback" not in answer.body
        assert client.request("GET", "/api/v1/jobs", {"Authorization": "token wrong"}).status == 401
        assert client.request("GET", "/api/v1/jobs?token=wrong").status == 401
        assert client.request("GET", "/api/v1/jobs", {"Cookie": "jobwarden_token=wrong"}).status == 401
        for header in (f"token {client.token}", f"Bearer {client.token}"):
            assert client.request("GET", "/api/v1/jobs", {"Authorization": header}).status == 200
        assert client.request("GET", f"/api/v1/jobs?token={client.token}").status == 200
        healthz = client.request("GET", "/healthz")  # the newest job succeeded
        assert (healthz.status, healthz.body) == (200, b"ok\n")
        server = client.request("GET", "/api/v1/server", client.auth())
        assert server.status == 200 and server.json()["read_only"] is False
        assert client.request("GET", "/api/v1/server").status == 401


def test_healthz_answers_a_probe_as_jobwarden_health_does(jw: Jobwarden) -> None:
    """A kubelet's probe: no token, the pod's IP as Host; `ok` 200, `failed`/`hung` 503, nothing else."""
    with web_server(jw.home) as served:
        client = Client(served)
        none_yet = client.request("GET", "/healthz", {"Host": "10.1.2.3:8765"})
        assert (none_yet.status, none_yet.body) == (503, b"failed\n")  # no job: never called healthy
        jw("run", "--wait", "--", "sh", "-c", "exit 3")
        failed = client.request("GET", "/healthz", {"Host": "10.1.2.3:8765"})
        assert (failed.status, failed.body) == (503, b"failed\n")
        assert jw("health").returncode == 1
        jw("run", "--wait", "--", "true", check=True)
        assert client.request("GET", "/healthz").body == b"ok\n"
        assert jw("health").returncode == 0


def test_a_foreign_host_is_refused_before_anything_else(jw: Jobwarden) -> None:
    with web_server(jw.home) as served:
        client = Client(served)
        for host in ("evil.example", f"evil.example:{client.port}", "127.0.0.1:1"):
            assert client.request("GET", "/api/v1/jobs", {**client.auth(), "Host": host}).status == 403
            assert client.request("GET", "/", {"Host": host}).status == 403
        for host in (f"localhost:{client.port}", f"[::1]:{client.port}", f"127.0.0.1:{client.port}"):
            assert client.request("GET", "/api/v1/jobs", {**client.auth(), "Host": host}).status == 200
    with web_server(jw.home, allow_hosts=["gpu-box.internal"]) as served:
        client = Client(served)
        answer = client.request("GET", "/api/v1/jobs", {**client.auth(), "Host": "gpu-box.internal:8080"})
        assert answer.status == 200


def test_the_token_in_the_address_becomes_a_session_cookie(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "true", check=True)
    with web_server(jw.home) as served:
        client = Client(served)
        answer = client.request("GET", f"/jobs/1?run=1&token={client.token}")
        assert answer.status == 303
        assert answer.headers["Location"] == "/jobs/1?run=1"  # the token leaves the address bar
        cookie = answer.headers["Set-Cookie"]
        name, _, value = cookie.split(";")[0].partition("=")
        assert name == f"jobwarden-{client.port}-{served.app.sessions.tag}"  # named per server
        assert client.token not in cookie  # a session, not the token
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
        page = client.request("GET", "/jobs/1?run=1", {"Cookie": f"{name}={value}"})
        assert page.status == 200 and b'data-job="1"' in page.body
        for header in (f"token {value}", f"Bearer {value}"):  # worth nothing as a token
            assert client.request("GET", "/api/v1/jobs", {"Authorization": header}).status == 401


def test_security_headers(jw: Jobwarden) -> None:
    jw("run", "--wait", "--name", "<script>alert(1)</script>", "--", "true", check=True)
    with web_server(jw.home) as served:
        client = Client(served)
        page = client.get("/jobs/1").body
        assert b"<script>alert" not in page and b"&lt;script&gt;alert(1)&lt;/script&gt;" in page
        head = client.request("HEAD", "/", client.auth())  # no handler: the base class's answer, as JSON
        assert head.status == 501 and head.headers["Content-Type"] == "application/json"
        for path in ("/", "/api/v1/jobs", "/api/v1/jobs/1"):
            answer = client.get(path)
            assert answer.headers["Content-Security-Policy"].startswith("default-src 'self'")
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
            assert answer.headers["Cache-Control"] == "no-store"
        assert b"<script>" not in client.get("/").body  # no inline script: the policy would block it


def test_a_change_needs_the_header_and_our_origin(jw: Jobwarden, tmp_path: Path) -> None:
    job_id, _ = start_ticker(jw, tmp_path)  # ended by the stop below
    with web_server(jw.home) as served:
        client = Client(served)
        stop = f"/api/v1/jobs/{job_id}/stop"
        refused = [
            client.request("POST", stop, {"X-Jobwarden": "1"}, b"{}"),  # no token
            client.post(stop, {"X-Jobwarden": ""}),  # what a cross-origin form sends: no custom header
            client.post(stop, {"Origin": f"http://127.0.0.1:{client.port + 1}"}),  # another local port
            client.post(stop, {"Origin": "null"}),
        ]
        assert [a.status for a in refused] == [401, 403, 403, 403]
        assert "X-Jobwarden" in refused[1].json()["error"]
        assert client.get(stop).status == 405  # nothing changes on GET
        assert jw.status(job_id)["state"] == "running"
        stopped = client.post(stop)
        assert stopped.status == 200, stopped.text
        assert stopped.json() == {**stopped.json(), "id": job_id, "state": "stopped", "already_ended": False}
    assert jw.status(job_id)["state"] == "stopped"


def test_read_only_removes_stop_and_dump(jw: Jobwarden, tmp_path: Path) -> None:
    job_id, go = start_ticker(jw, tmp_path)
    try:
        with web_server(jw.home, read_only=True) as served:
            client = Client(served)
            for action in ("stop", "dump"):
                answer = client.post(f"/api/v1/jobs/{job_id}/{action}")
                assert answer.status == 403 and "read-only" in answer.json()["error"]
            assert client.get("/api/v1/server").json()["read_only"] is True
        assert jw.status(job_id)["state"] == "running"
    finally:
        finish(jw, job_id, go)


# --- what it answers --------------------------------------------------------------------------------


def test_the_api_answers_what_the_cli_prints(jw: Jobwarden, tmp_path: Path) -> None:
    jw("run", "--wait", "--name", "crash", "--", sys.executable, *FAILING)
    jw("run", "--wait", "--", "sh", "-c", "echo one; echo two", check=True)
    with web_server(jw.home) as served:
        client = Client(served)
        listed = client.get("/api/v1/jobs").json()
        cli = jw.json("ps", "--all")
        assert [{k: j[k] for k in c} for j, c in zip(listed, cli, strict=True)] == cli
        assert all(j["gpu_ids"] == [] and j["queued_reason"] is None for j in listed)
        for ref in ("1", "crash", "2"):
            # what `status --json` prints, plus the page's options and env keys
            for query, args in (("", ()), ("?run=1", ("--run", "1"))):
                status, cli_status = (
                    client.get(f"/api/v1/jobs/{ref}{query}").json(),
                    jw.json("status", ref, *args),
                )
                assert {k: status[k] for k in cli_status} == cli_status
                assert status["env_keys"] == [] and status["options"]["grace_s"] == 10.0
            assert client.get(f"/api/v1/jobs/{ref}/explain").json() == jw.json("explain", ref)
        assert jw.json("explain", "1")["findings"], "a crash has a finding"
        assert client.get("/api/v1/jobs/2/log?tail=1").text == "two\n"
        assert client.get("/api/v1/jobs/2/log").text == "one\ntwo\n"
        assert client.get("/api/v1/jobs/2/log?offset=4").json() == {
            "offset": 4,
            "next_offset": 8,
            "size": 8,
            "text": "two\n",
        }
        samples = client.get("/api/v1/jobs/1/samples")
        assert samples.status == 200 and isinstance(samples.json(), list)
        assert client.get("/api/v1/jobs/1/stacks").json() == []


def test_errors_are_json_with_a_message(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "true", check=True)
    with web_server(jw.home) as served:
        client = Client(served)
        cases = {
            "/api/v1/jobs/99": 404,
            "/jobs/99": 404,
            "/api/v1/jobs/1?run=x": 400,
            "/api/v1/jobs/1?run=7": 404,
            "/api/v1/jobs/1/log?offset=-1": 400,
            "/static/../../auth.py": 404,
            "/static/app.py": 404,
            "/nothing": 404,
        }
        for path, status in cases.items():
            answer = client.get(path)
            assert (answer.status, answer.headers["Content-Type"]) == (status, "application/json"), path
            assert answer.json()["error"] and b"Traceback" not in answer.body
        dump = client.post("/api/v1/jobs/1/dump")  # an ended job with no stacks stored
        assert dump.status == 409 and "no stacks" in dump.json()["error"]


def test_a_unix_socket_is_private_and_answers(jw: Jobwarden, tmp_path: Path) -> None:
    path = tmp_path / "web.sock"
    with web_server(jw.home, socket_path=path) as served:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(str(path))
            token = served.app.token
            head = ["GET /api/v1/jobs HTTP/1.1", "Host: localhost", f"Authorization: token {token}"]
            sock.sendall("\r\n".join([*head, "Connection: close", "", ""]).encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"[]")


# --- the log stream ---------------------------------------------------------------------------------


def test_the_log_streams_resumes_by_offset_and_ends_with_the_run(jw: Jobwarden, tmp_path: Path) -> None:
    job_id, go = start_ticker(jw, tmp_path, first=3)
    stream = f"/api/v1/jobs/{job_id}/log/stream"
    with web_server(jw.home) as served:
        client = Client(served)
        with EventReader(client, stream + "?offset=0") as events:
            text, last_id = events.text_until("line 2\n")
        assert text == "line 0\nline 1\nline 2\n" and last_id == str(len(text))
        write_fifo(go, "2 0\n")
        with EventReader(client, stream, {"Last-Event-ID": str(last_id)}) as events:
            text, _ = events.text_until("line 4\n")
            end = events.next()
            while end.name == ":":
                end = events.next()
        assert text == "line 3\nline 4\n"
        assert end.name == "end" and json.loads(end.data)["state"] == "succeeded"
        with EventReader(client, stream + "?offset=7") as events:  # an ended run: all of it, then the end
            text, _ = events.text_until("line 4\n")
            assert text.startswith("line 1\n") and events.next().name == "end"


def test_a_quiet_stream_sends_heartbeats_and_streams_are_capped(jw: Jobwarden, tmp_path: Path) -> None:
    job_id, go = start_ticker(jw, tmp_path, first=1)
    try:
        with web_server(jw.home) as served:
            served.app.heartbeat_s = 0.2
            served.app.streams = threading.BoundedSemaphore(1)
            client = Client(served)
            stream = f"/api/v1/jobs/{job_id}/log/stream"
            with EventReader(client, stream) as events:
                assert events.next().name == "log"
                assert events.next().name == ":"  # the heartbeat, while the job prints nothing
                second = client.get(stream)
                assert second.status == 503 and "too many" in second.json()["error"]
    finally:
        finish(jw, job_id, go)


# --- never the environment --------------------------------------------------------------------------


def test_the_environment_is_served_nowhere(jw: Jobwarden, tmp_path: Path) -> None:
    marker = "s3cr3t-marker-5d1f"
    job_id, go = start_ticker(jw, tmp_path, 2, "--env", f"SECRET={marker}", "--name", "secretive")
    bodies: list[bytes] = []
    with web_server(jw.home) as served:
        client = Client(served)

        def everything() -> None:
            api = f"/api/v1/jobs/{job_id}"
            for path in ("/", f"/jobs/{job_id}", "/api/v1/jobs", api, "/metrics", f"{api}/explain",
                         f"{api}/samples", f"{api}/stacks", f"{api}/log", f"{api}/log?tail=5",
                         f"{api}/log?offset=0"):  # fmt: skip
                bodies.append(client.get(path).body)

        everything()
        with EventReader(client, f"/api/v1/jobs/{job_id}/log/stream?offset=0") as events:
            bodies.append(events.text_until("line 1\n")[0].encode())
        finish(jw, job_id, go, 1, 3)
        everything()  # ended, with its findings
        with EventReader(client, f"/api/v1/jobs/{job_id}/log/stream?offset=0") as events:
            bodies.append(events.text_until("line 2\n")[0].encode())
            bodies.append(events.next().data.encode())
    assert marker.encode() in (jw.home / "jobwarden.db").read_bytes()  # the marker is there to leak
    assert len(bodies) == 25
    assert [b for b in bodies if marker.encode() in b] == []


# --- the command ------------------------------------------------------------------------------------


def test_the_command_prints_its_address_first_and_warns_off_loopback(jw: Jobwarden) -> None:
    web = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", "web", "--port", "0", "--host", "0.0.0.0"],
        env=jw.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert web.stdout is not None and web.stderr is not None
        url = web.stdout.readline().strip()
        warning = web.stderr.readline()
        token = (jw.home / "web.token").read_text().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={token}")
        assert ":0/" not in url and "WARNING" in warning and "0.0.0.0" in warning
        assert stat.S_IMODE((jw.home / "web.token").stat().st_mode) == 0o600
    finally:
        web.terminate()
        web.communicate(timeout=30)  # reaps it and closes the pipes
    assert web.returncode == 0
    bad = jw("web", "--port", "70000")
    assert bad.returncode == 2 and bad.stderr.startswith("jobwarden: --port:")
    assert "Traceback" not in bad.stderr


def test_no_other_command_imports_the_web_server(jw: Jobwarden) -> None:
    """uvicorn, h11 and asyncio cost `jobwarden web` ~100 ms of imports; every other command must not pay."""
    jw("run", "--wait", "--name", "done", "--", "true", check=True)
    modules = ("http.server", "socketserver", "asyncio", "uvicorn", "h11", "jobwarden.web")
    code = (
        "import sys; from jobwarden.cli import main; main.build_parser('run');"
        "[main.main(a) for a in (['ps', '--all'], ['status', 'done'], ['logs', 'done'], ['explain', 'done'],"
        " ['metrics', 'done', '--prometheus'], ['doctor'])];"
        f"print('loaded:', *sorted(m for m in {modules!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=jw.env, capture_output=True, text=True, timeout=90)
    assert out.stdout.splitlines()[-1] == "loaded:", out.stdout + out.stderr


# --- connections (issue 20, item 6) -----------------------------------------------------------------


def test_past_the_cap_an_idle_connection_makes_room_and_a_busy_one_does_not(
    jw: Jobwarden, tmp_path: Path
) -> None:
    job_id, go = start_ticker(jw, tmp_path, first=1)
    try:
        with web_server(jw.home, limits=Limits(max_connections=3)) as served:
            client = Client(served)
            idle = [socket.create_connection(("127.0.0.1", client.port), timeout=60) for _ in range(3)]
            idle[1].sendall(b"GET / HTTP/1.1\r\n")  # half a head is idle too
            assert client.get("/api/v1/jobs").status == 200  # the oldest idle one made room
            assert idle[0].recv(1) == b""
            for sock in idle:
                sock.close()
        with web_server(jw.home, limits=Limits(max_connections=2)) as served:
            client = Client(served)
            stream = f"/api/v1/jobs/{job_id}/log/stream"
            with EventReader(client, stream) as first, EventReader(client, stream) as second:
                assert first.next().name == "log" and second.next().name == "log"  # both busy
                refused = client.get("/api/v1/jobs")
                assert refused.status == 503 and "busy" in refused.json()["error"]
    finally:
        finish(jw, job_id, go)


def test_a_session_in_use_is_renewed_and_an_expired_one_is_refused(jw: Jobwarden) -> None:
    with web_server(jw.home) as served:
        client = Client(served)
        sessions = served.app.sessions
        name = sessions.cookie_name(f"127.0.0.1:{client.port}")
        fresh, hour_old, expired = (sessions.issue(name, time.time() - age) for age in (0, 3700, 90_000))
        answer = client.request("GET", "/api/v1/jobs", {"Cookie": f"{name}={fresh}"})
        assert answer.status == 200 and answer.headers["Set-Cookie"] is None
        renewed = client.request("GET", "/api/v1/jobs", {"Cookie": f"{name}={hour_old}"})
        assert renewed.status == 200 and renewed.headers["Set-Cookie"].startswith(f"{name}=")
        value = renewed.headers["Set-Cookie"].split(";")[0].partition("=")[2]
        assert sessions.age(f"{name}={value}", name, time.time()) is not None
        assert client.request("GET", "/api/v1/jobs", {"Cookie": f"{name}={expired}"}).status == 401


def test_the_status_names_env_keys_never_values_and_rerun_starts_it_again(jw: Jobwarden) -> None:
    hook = "https://hooks.example.com/services/T000/B000/secretpath"
    ran = jw("run", "--wait", "--env", "API_TOKEN=hunter2", "--notify", hook, "--", "sh", "-c", "echo again")
    assert ran.returncode == 0, ran.stderr
    with web_server(jw.home) as served:
        client = Client(served)
        answer = client.get("/api/v1/jobs/1")
        assert answer.json()["env_keys"] == ["API_TOKEN"]
        assert answer.json()["options"]["notify"] == "https://hooks.example.com/…"
        assert b"hunter2" not in answer.body and b"secretpath" not in answer.body
        assert client.post("/api/v1/jobs/1/rerun", {"X-Jobwarden": ""}).status == 403  # Stop's protection
        assert client.request("POST", "/api/v1/jobs/1/rerun", {"X-Jobwarden": "1"}, b"{}").status == 401
        assert [j["id"] for j in jw.json("ps", "--all")] == [1]
        started = client.post("/api/v1/jobs/1/rerun")
        assert started.status == 200, started.body
        assert started.json()["rerun_of"] == 1 and started.json()["id"] == 2
    assert jw("wait", "2").returncode == 0
    assert jw.status(2)["rerun_of"] == 1 and jw.output(2) == "again\n"
    with web_server(jw.home, read_only=True) as served:
        assert Client(served).post("/api/v1/jobs/1/rerun").status == 403


def test_the_list_answers_a_page_filtered_on_the_server(jw: Jobwarden) -> None:
    for name, code in (("prep", 0), ("train-a", 3), ("train-b", 0), ("train-c", 3)):
        jw("run", "--wait", "--name", name, "--", sys.executable, "-c", f"raise SystemExit({code})")
    with web_server(jw.home) as served:
        client = Client(served)
        whole = client.get("/api/v1/jobs")  # no page asked: the whole list, as `ps --all --json`
        assert [j["id"] for j in whole.json()] == [1, 2, 3, 4] and "X-Total-Count" not in whole.headers
        failed = client.get("/api/v1/jobs?state=failed&limit=1")
        assert [j["name"] for j in failed.json()] == ["train-c"]  # newest first
        assert failed.headers["X-Total-Count"] == "2"
        assert json.loads(failed.headers["X-State-Counts"]) == {"succeeded": 2, "failed": 2}
        second = client.get("/api/v1/jobs?state=failed&limit=1&offset=1").json()
        assert [j["name"] for j in second] == ["train-a"]
        named = client.get("/api/v1/jobs?name=TRAIN&limit=100")
        assert [j["id"] for j in named.json()] == [4, 3, 2] and named.headers["X-Total-Count"] == "3"
        assert client.get("/api/v1/jobs?name=1").json()[0]["name"] == "prep"  # an id is a name too
        assert client.get("/api/v1/jobs?state=active").json() == []
        refused = client.get("/api/v1/jobs?limit=0")
        assert refused.status == 400 and "limit" in refused.json()["error"]
