"""`ps` at the command line: paging with --last, its JSON keys, bad input, and that neither `run` nor
`ps` loads a frontend's libraries (each frontend imports them in its own command handler)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import Jobwarden
from tests.unit.test_joblist import SUMMARY_KEYS

pytestmark = pytest.mark.integration

FRONTEND_MODULES = (
    "textual", "rich", "http.server", "asyncio", "socketserver", "prometheus_client", "ray", "jobwarden.ray",
    "uvicorn", "h11", "jobwarden.web",
)  # fmt: skip


def test_ps_last_lists_the_newest_jobs_oldest_first(jw: Jobwarden) -> None:
    for name in ("a", "b", "c"):
        jw("run", "--name", name, "--wait", "--", "sh", "-c", f"exit {ord(name) - ord('a')}", check=False)
    jobs = jw.json("ps", "--all", "--last", "2")
    assert [(j["name"], j["state"], j["exit_code"]) for j in jobs] == [("b", "failed", 1), ("c", "failed", 2)]
    assert [list(j) for j in jobs] == [SUMMARY_KEYS, SUMMARY_KEYS]
    assert [j["name"] for j in jw.json("ps", "--all", "--last", "10")] == ["a", "b", "c"]
    table = jw("ps", "--all", "--last", "1").stdout.splitlines()
    assert len(table) == 2 and " c " in table[1] and "failed (2)" in table[1]


def test_ps_shows_each_ended_runs_verdict_and_wide_its_title(jw: Jobwarden) -> None:
    # an exception, an outside SIGKILL, a bare exit code: every ended run says why in the list
    jw("run", "--name", "raises", "--wait", "--", sys.executable, "-c", "raise KeyError('shard 7')")
    jw("run", "--name", "killed", "--wait", "--", "sh", "-c", "kill -9 $$")
    jw("run", "--name", "exits", "--wait", "--", "sh", "-c", "exit 3")
    jobs = {j["name"]: j for j in jw.json("ps", "--all")}
    assert {name: j["finding"] for name, j in jobs.items()} == {
        "raises": "python-exception",
        "killed": "killed-externally",
        "exits": "exit-code",
    }
    assert jobs["raises"]["finding_title"] == "Uncaught KeyError"
    table = jw("ps", "--all").stdout
    assert "failed (1) [python-exception]" in table and "failed (SIGKILL) [killed-externally]" in table
    wide = jw("ps", "--all", "--wide").stdout.splitlines()
    assert "VERDICT" in wide[0]
    assert any(" raises " in line and "Uncaught KeyError" in line for line in wide)


@pytest.mark.parametrize("value", ["0", "-3", "ten"])
def test_a_bad_last_gets_one_line_naming_it(jw: Jobwarden, value: str) -> None:
    result = jw("ps", "--all", f"--last={value}")
    assert result.returncode == 2
    assert result.stderr.startswith("jobwarden: bad --last"), result.stderr
    assert "Traceback" not in result.stderr


IMPORTED_BY = """
    import sys
    from jobwarden.cli.main import build_parser, main
    build_parser("run").parse_args(["run", "--name", "x", "--", "true"])
    frontends = {frontends!r}
    after_run = [m for m in frontends if m in sys.modules]
    main({ps!r})
    sys.stdout.flush()
    print("after-run", *after_run, file=sys.stderr)
    print("after-ps", *(m for m in frontends if m in sys.modules), file=sys.stderr)
"""


def test_run_and_ps_load_no_frontend_library(jw: Jobwarden) -> None:
    """The web, the terminal UI and /metrics have their libraries; `run` and `ps` must not pay for them."""
    jw("run", "--name", "failed", "--wait", "--", "false")
    for ps in (["ps"], ["ps", "--all"]):
        code = textwrap.dedent(IMPORTED_BY.format(frontends=FRONTEND_MODULES, ps=ps))
        done = subprocess.run(
            [sys.executable, "-c", code], env=jw.env, capture_output=True, text=True, timeout=90, check=True
        )
        assert "failed" in done.stdout or ps == ["ps"]
        assert done.stderr.splitlines()[-2:] == ["after-run", "after-ps"], done.stderr


# Heavy standard modules a detached `run` must not load before it returns (each costs milliseconds of
# every `run`: dataclasses pulls inspect, ast and tokenize; hashlib its C bindings), and the group and
# rules modules only a group run or an ended run needs
NOT_ON_RUNS_PATH = ("dataclasses", "hashlib", "jobwarden.store.groupdir", "jobwarden.rules.verdict")

RUN_IMPORTS = """
    import sys
    from jobwarden.cli.main import main
    code = main(["run", "--name", "x", "--", "true"])
    print("loaded", *(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def test_run_loads_no_heavy_module_before_it_returns(jw: Jobwarden) -> None:
    code = textwrap.dedent(RUN_IMPORTS.format(heavy=NOT_ON_RUNS_PATH))
    done = subprocess.run(
        [sys.executable, "-c", code], env=jw.env, capture_output=True, text=True, timeout=90, check=True
    )
    assert done.stderr.splitlines()[-1] == "loaded", done.stderr
    jw("wait", done.stdout.strip())
