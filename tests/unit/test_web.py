"""The web dashboard's pure parts: the token file, the Host allow-list, the proof a request presents, the
CSRF checks, the log's piece boundaries, and the package data (the vendored uPlot, unmodified)."""

from __future__ import annotations

import fnmatch
import hashlib
import stat
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from jobwarden.web import auth
from jobwarden.web.logview import whole_lines
from jobwarden.web.messages import Headers

UPLOT = {  # uPlot 1.6.32 from `npm pack uplot@1.6.32`; static/vendor/uplot/VERSION says the same
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    "LICENSE": "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd",
}
STATIC = resources.files("jobwarden.web") / "static"


def test_the_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    token = auth.load_or_create_token(tmp_path)
    path = tmp_path / auth.TOKEN_FILE
    assert len(token) >= 43 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.load_or_create_token(tmp_path) == token
    path.chmod(0o644)  # readable by others: no longer a secret
    replaced = auth.load_or_create_token(tmp_path)
    assert replaced != token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [auth.TOKEN_FILE]


def test_the_host_allow_list() -> None:
    allowed = auth.allowed_hosts(["127.0.0.1"], 8765, ["box.lan", "proxy:443"])
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765", "LOCALHOST:8765", "box.lan", "box.lan:9"):
        assert auth.host_allowed(host, allowed), host
    for host in (None, "", "127.0.0.1", "127.0.0.1:8766", "evil.example:8765", "proxy", "proxy:80", "[::1]"):
        assert not auth.host_allowed(host, allowed), host
    assert auth.host_allowed("proxy:443", allowed)
    unix = auth.allowed_hosts([], None, [])
    assert auth.host_allowed("localhost", unix) and auth.host_allowed("localhost:8765", unix)
    assert not auth.host_allowed("evil.example", unix)


def test_port_80_is_the_port_a_browser_leaves_out() -> None:
    allowed = auth.allowed_hosts(["gpu-box"], 80, [])
    for host in ("127.0.0.1", "127.0.0.1:80", "[::1]", "gpu-box", "GPU-BOX:80"):
        assert auth.host_allowed(host, allowed), host
    assert not auth.host_allowed("127.0.0.1:8080", allowed)
    ok = {"X-Jobwarden": "1", "Host": "127.0.0.1"}
    assert auth.post_refusal(Headers.of({**ok, "Origin": "http://127.0.0.1"})) is None
    assert auth.post_refusal(Headers.of({**ok, "Host": "127.0.0.1:80", "Origin": "http://127.0.0.1"})) is None
    assert auth.post_refusal(Headers.of({**ok, "Origin": "http://127.0.0.1:8080"})) is not None
    assert auth.post_refusal(Headers.of({**ok, "Origin": "https://127.0.0.1"})) is not None


def test_what_a_request_presents_its_own_proof_first() -> None:
    cookie = {"Cookie": "a=1; jobwarden-8765-abcd=xyz"}
    assert auth.presented(Headers.of({"Authorization": "Bearer abc", **cookie}), {}) == ("header", "abc")
    assert auth.presented(Headers.of({"Authorization": "token abc"}), {"token": "q"}) == ("header", "abc")
    assert auth.presented(Headers.of(cookie), {"run": "2", "token": "q"}) == ("query", "q")  # URL wins
    assert auth.presented(Headers.of(cookie), {}) == ("cookie", cookie["Cookie"])
    assert auth.presented(Headers.of({"Authorization": "Basic abc"}), {}) == ("", "")
    assert auth.token_ok("abc", "abc") and not auth.token_ok("abd", "abc") and not auth.token_ok(None, "abc")
    assert not auth.token_ok("é" * 43, "abc")  # no TypeError from compare_digest on non-ASCII text


def test_a_change_needs_the_custom_header_and_our_origin() -> None:
    ok = {"X-Jobwarden": "1", "Host": "127.0.0.1:8765"}
    assert auth.post_refusal(Headers.of(ok)) is None
    assert auth.post_refusal(Headers.of({**ok, "Origin": "http://127.0.0.1:8765"})) is None
    assert auth.post_refusal(Headers.of({"Host": "127.0.0.1:8765"})) is not None
    assert auth.post_refusal(Headers.of({**ok, "Origin": "http://127.0.0.1:8766"})) is not None
    assert auth.post_refusal(Headers.of({**ok, "Origin": "null"})) is not None


@pytest.mark.parametrize(
    ("data", "limit", "expected"),
    [
        (b"a\nb\nc", 5, b"a\nb\n"),  # cut short: at the last line end
        (b"a\nb\nc", 6, b"a\nb\nc"),  # all of it: a partial last line is sent as it is
        (b"ab\xc3\xa9", 4, b"ab\xc3\xa9"),  # no line end, whole characters
        (b"abc\xc3", 4, b"abc"),  # a character cut in two waits for its second byte
        (b"abc\xe2\x82", 9, b"abc"),
        (b"", 4, b""),
    ],
)
def test_log_pieces_keep_lines_and_characters_whole(data: bytes, limit: int, expected: bytes) -> None:
    assert whole_lines(data, limit) == expected


def test_uplot_is_vendored_unmodified_with_its_licence() -> None:
    folder = STATIC / "vendor" / "uplot"
    for name, digest in UPLOT.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (folder / "LICENSE").read_text()
    assert "1.6.32" in (folder / "VERSION").read_text()


def test_pages_load_only_their_own_files() -> None:
    for page in ("list.html", "job.html"):
        html = (STATIC / page).read_text()
        assert "<script>" not in html and "<style" not in html and " on" + "click=" not in html
        assert "http://" not in html and "https://" not in html
    scripts = [p.name for p in STATIC.iterdir() if p.name.endswith(".js")]
    assert sorted(scripts) == ["common.js", "flame.js", "job.js", "list.js"]
    for name in scripts:
        assert "innerHTML" not in (STATIC / name).read_text(), name  # job text only as text nodes


def test_the_package_ships_the_static_files() -> None:
    # setuptools installs only the package data pyproject names: every file in static/ must match
    config = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["jobwarden.web"]
    folder = Path(str(STATIC)).parent
    files = [str(p.relative_to(folder)) for p in (folder / "static").rglob("*") if p.is_file()]
    assert len(files) >= 9
    assert [f for f in files if not any(fnmatch.fnmatchcase(f, pat) for pat in patterns)] == []
