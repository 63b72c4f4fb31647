"""Progress of real jobs, with no change to their code: real tqdm, PyTorch Lightning (its default bar, and
its tqdm bar), Keras 3, torchrun's ranks, `jobwarden.heartbeat`, a job with no progress, coloured bars;
in `ps`, `status`, `explain`, `metrics` and /metrics (checked by promtool); an ended run keeps how far it
got, a restarted one says where it resumed, and a step counter that stops while the job spins is stalled,
then hung, then recovers."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.control.prometheus import exposition
from jobwarden.osapi.procfs import ProcFS
from jobwarden.progress.model import Progress
from jobwarden.store import Store
from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.integration.test_prometheus import promtool_check
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration
JOB = str(Path(__file__).parent / "jobs" / "progress_job.py")
DEADLINE_S = 120.0  # torch and Lightning take seconds to import on a loaded 2-core machine


class Held:
    """A job of progress_job.py that has reached its point and holds there until `go()`."""

    def __init__(
        self, jw: Jobwarden, tmp: Path, mode: str, *args: str, options: tuple[str, ...] = ()
    ) -> None:
        self.jw = jw
        self.ready, self.go_fifo = make_fifo(tmp / f"ready-{mode}"), make_fifo(tmp / f"go-{mode}")
        self.id = int(
            jw.start(sys.executable, JOB, mode, str(self.ready), str(self.go_fifo), *args, options=options)[
                "id"
            ]
        )

    def wait_ready(self) -> Held:
        read_fifo(self.ready, timeout_s=DEADLINE_S)
        return self

    def go(self) -> None:
        write_fifo(self.go_fifo, "go\n", timeout_s=DEADLINE_S)


def progress_of(jw: Jobwarden, job: int, run: int = 1) -> Progress | None:
    with Store(jw.home) as store:
        return store.progress(job, run)


def wait_progress(
    jw: Jobwarden, job: int, what: str, ok: Callable[[Progress], bool], run: int = 1
) -> Progress:
    """The shim reads the job's progress once a tick: wait (with a deadline) until it says what we want."""

    def said() -> Progress | None:
        found = progress_of(jw, job, run)
        return found if found is not None and ok(found) else None

    return eventually(f"job {job}: {what}", said, DEADLINE_S, every_s=0.1)


def ps_json(jw: Jobwarden, job: int, *flags: str) -> dict[str, Any]:
    return next(j for j in jw.json("ps", *flags) if j["id"] == job)


def ps_row(jw: Jobwarden, job: int, *flags: str) -> str:
    out = jw("ps", *flags, check=True).stdout
    return next(line for line in out.splitlines() if line.split()[0] == str(job))


def require(module: str) -> None:
    """A library the job needs (looked up, not imported here: keras needs its backend chosen first)."""
    if importlib.util.find_spec(module) is None:
        unavailable(f"{module} is not installed (the realworld extra)")


@pytest.fixture
def finish() -> Iterator[list[Held]]:
    """Let every held job go on and end; a test that failed midway must not leave one waiting."""
    held: list[Held] = []
    yield held
    for job in held:
        job.jw("stop", str(job.id))


# --- tqdm --------------------------------------------------------------------------------------------------


def test_a_tqdm_bar_everywhere(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    job = Held(jw, tmp_path, "tqdm")
    finish.append(job)
    job.wait_ready()
    wait_progress(jw, job.id, "at 450", lambda p: p.step == 450)
    listed = ps_json(jw, job.id)["progress"]
    # a bar of "Epoch 3" of an unknown number of epochs: no fraction of the run, no ETA to its end
    assert {k: listed[k] for k in ("step", "total", "fraction", "unit", "source", "format", "label")} == {
        "step": 450,
        "total": 1000,
        "fraction": None,
        "unit": "it",
        "source": "output",
        "format": "tqdm",
        "label": "Epoch 3",
    }
    assert listed["observed"] == "in-process" and listed["epoch"] == {"n": 3, "total": None}
    assert listed["eta_s"] is None
    assert listed["metrics"]["loss"] == pytest.approx(1 / 450, rel=0.01) and listed["at"].endswith("Z")
    status = jw.status(job.id)["progress"]
    assert status["metrics"]["loss"] == pytest.approx(1 / 450, rel=0.01)
    assert "ep 3 45% 450/1000" in ps_row(jw, job.id)
    text = jw("status", str(job.id), check=True).stdout
    assert (
        "progress     ep 3 45% 450/1000" in text
        and "loss 0.00222" in text
        and "tqdm, read in-process" in text
    )
    # held at 450 until a once-a-second sample has it: the checks above may take less than a second
    at_450 = lambda: any(s["step"] == 450 for s in jw.json("metrics", str(job.id)))  # noqa: E731
    eventually("a metrics sample at step 450", at_450, 30, every_s=0.2)
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    ended = jw.status(job.id)["progress"]
    assert (ended["step"], ended["closed"], ended["rate"], ended["eta_s"]) == (1000, True, None, None)
    assert "100% 1000/1000" in ps_row(jw, job.id, "--all")
    samples = jw.json("metrics", str(job.id))
    assert any(s["step"] == 450 for s in samples) and all("step_rate" in s for s in samples)


def test_without_hooks_the_log_says_the_same(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    job = Held(jw, tmp_path, "tqdm", options=("--no-py-hooks",))
    finish.append(job)
    job.wait_ready()
    got = wait_progress(jw, job.id, "at 450 from the log", lambda p: p.step == 450)
    assert (got.observed, got.total, got.label, got.format) == ("log", 1000, "Epoch 3", "tqdm")
    assert got.loss == pytest.approx(1 / 450, rel=0.01)
    job.go()
    assert jw("wait", str(job.id)).returncode == 0


def test_an_ansi_coloured_bar(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    job = Held(jw, tmp_path, "ansi", options=("--no-py-hooks",))
    finish.append(job)
    job.wait_ready()
    assert "\x1b[" in jw.output(job.id)  # it did print colours
    got = wait_progress(jw, job.id, "at 40", lambda p: p.step == 40)
    assert (got.label, got.total) == ("training", 100)
    assert "\x1b" not in jw("status", str(job.id), check=True).stdout
    job.go()
    assert jw("wait", str(job.id)).returncode == 0


# --- other sources and none -----------------------------------------------------------------------------


def test_a_heartbeat_with_a_total_and_a_loss(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    job = Held(jw, tmp_path, "heartbeat")
    finish.append(job)
    job.wait_ready()
    wait_progress(jw, job.id, "the heartbeat's step", lambda p: p.step == 85)
    got = jw.status(job.id)["progress"]
    assert {k: got[k] for k in ("step", "total", "fraction", "source", "format", "metrics")} == {
        "step": 85,
        "total": 1000,
        "fraction": 0.085,
        "source": "heartbeat",
        "format": "heartbeat",
        "metrics": {"loss": 0.0116},
    }
    assert "8% 85/1000" in ps_row(jw, job.id)
    job.go()
    assert jw("wait", str(job.id)).returncode == 0


def test_a_job_with_no_progress_has_none(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    job = Held(jw, tmp_path, "quiet")
    finish.append(job)
    job.wait_ready()
    with Store(jw.home) as store:  # a few ticks seen: samples written
        eventually(
            "two samples written", lambda: len(store.readings(job.id, 1)) >= 2, DEADLINE_S, every_s=0.1
        )
    assert ps_json(jw, job.id)["progress"] is None
    assert jw.status(job.id)["progress"] is None
    assert jw.json("explain", str(job.id))["progress"] is None
    assert "PROGRESS" not in jw("ps", check=True).stdout  # no job shows progress: no column
    assert all(s["step"] is None and s["step_rate"] is None for s in jw.json("metrics", str(job.id)))
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    assert jw.status(job.id)["progress"] is None  # never invented, not at the end either


# --- how far it got -----------------------------------------------------------------------------------------


def test_a_crash_says_how_far_it_got(jw: Jobwarden, tmp_path: Path) -> None:
    require("tqdm")
    job = int(jw.start(sys.executable, JOB, "crash", "-", "-")["id"])
    assert jw("wait", str(job)).returncode == 1
    got = jw.json("explain", str(job))["progress"]
    assert (got["step"], got["total"], got["fraction"]) == (620, 1000, 0.62)
    text = jw("explain", str(job), check=True).stdout
    assert "progress: stopped at 62%, step 620/1000" in text
    assert "62% 620/1000" in ps_row(jw, job, "--all")


def test_a_restarted_run_says_where_it_resumed(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    checkpoint = tmp_path / "checkpoint"
    options = ("--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0.1s")
    job = Held(jw, tmp_path, "resume", str(checkpoint), options=options)
    finish.append(job)
    job.wait_ready()  # run 2 holds: run 1 failed at 620
    wait_progress(jw, job.id, "run 2 at 620", lambda p: p.step == 620, run=2)
    status = jw.status(job.id)
    assert status["run"] == 2 and status["progress"]["first_step"] == 600
    assert [(r["n"], r["step"], r["total"]) for r in status["runs"]] == [(1, 620, 1000), (2, 620, 1000)]
    assert "resumed      resumed at step 600 (run 1 had reached 620/1000)" in jw("status", str(job.id)).stdout
    job.go()
    assert jw("wait", str(job.id)).returncode == 0


# --- real libraries --------------------------------------------------------------------------------------


@pytest.mark.timeout(300)  # Lightning and torch take long to import on a loaded 2-core machine
@pytest.mark.parametrize("bar", ["default", "tqdm"])
def test_pytorch_lightning(jw: Jobwarden, tmp_path: Path, finish: list[Held], bar: str) -> None:
    """Lightning's default bar is RichProgressBar where rich is installed (as here: textual needs it), which
    prints nothing while piped: the hooks read it in-process. TQDMProgressBar is its default elsewhere."""
    require("pytorch_lightning")
    job = Held(jw, tmp_path, "lightning", bar)
    finish.append(job)
    job.wait_ready()
    got = wait_progress(jw, job.id, "inside epoch 0", lambda p: p.total == 16 and p.step == 5)
    assert got.observed == "in-process" and got.format == ("rich" if bar == "default" else "tqdm")
    assert got.epoch == 1.0 and (got.label or "").startswith("Epoch 0")  # Lightning's 0-based: the 1st
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    ended = progress_of(jw, job.id)
    assert ended is not None and (ended.step, ended.total, ended.epoch) == (16, 16, 2.0)


@pytest.mark.timeout(300)
def test_keras(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("keras")
    job = Held(jw, tmp_path, "keras")
    finish.append(job)
    job.wait_ready()
    # held in epoch 2 after its second step (the callback holds before Keras' own ProgbarLogger updates)
    got = wait_progress(jw, job.id, "at 2/8 of epoch 2", lambda p: (p.epoch, p.step, p.total) == (2.0, 2, 8))
    assert got.format == "keras" and not got.closed and got.loss is not None
    assert got.epochs == 3 and got.fraction == pytest.approx((8 + 2) / 24)  # Keras' "Epoch 2/3" line
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    ended = progress_of(jw, job.id)
    assert ended is not None and (ended.step, ended.total, ended.epoch, ended.closed) == (8, 8, 3.0, True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hooks", [True, False])
def test_torchrun_ranks_each_with_a_bar(
    jw: Jobwarden, tmp_path: Path, finish: list[Held], hooks: bool
) -> None:
    """Two ranks, two bars (rank 0 at 20/100, rank 1 at 60/100): rank 0's is shown, never a sum; without
    the hooks from torchrun's --tee output, each line prefixed with its rank."""
    require("torch")
    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--tee", "3"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(29700 + os.getpid() % 200 + int(hooks))]
    options = () if hooks else ("--no-py-hooks",)
    job = int(jw.start(*torchrun, JOB, "rank-bar", str(ready), str(go), options=options)["id"])
    read_fifo(ready, timeout_s=DEADLINE_S)
    try:
        got = wait_progress(jw, job, "rank 0's bar", lambda p: p.step == 20 and p.rank == 0)
        assert (got.total, got.label, got.observed) == (100, "rank 0", "in-process" if hooks else "log")
        assert "20% 20/100" in ps_row(jw, job)
        assert "[default1]:" in jw.output(job)  # rank 1 printed its bar too: it was not taken, nor added
    finally:
        jw("stop", str(job))


# --- a step counter that stops while the job spins ---------------------------------------------------------


@pytest.mark.timeout(300)  # a pace, a stall, a hang with its stacks, a recovery: a few windows
def test_a_spin_is_stalled_then_hung_then_recovers(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    events = tmp_path / "events.jsonl"
    hook = f"cat >> {events}; echo >> {events}"
    options = ("--hang-timeout", "8s", "--on-event", hook)
    job = Held(jw, tmp_path, "spin", options=options)
    finish.append(job)
    job.wait_ready()  # it spins from here: 100% CPU, no step
    stalled = wait_progress(jw, job.id, "stalled", lambda p: p.stalled_since is not None)
    assert stalled.step is not None and 200 <= stalled.step <= 240
    assert "stalled" in ps_row(jw, job.id)
    # the hang watchdog: a step counter that stands still is no progress, however busy the CPU
    found = eventually("a hang finding", lambda: jw.status(job.id)["findings"], DEADLINE_S, every_s=0.2)
    assert found[0]["rule"] in ("no-progress", "collective-hang")
    evidence = " ".join(found[0]["evidence"])
    assert "the step counter stands at step" in evidence and "no new step for" in evidence
    job.go()
    wait_progress(jw, job.id, "moving again", lambda p: p.stalled_since is None and (p.step or 0) > 240)
    assert jw("wait", str(job.id)).returncode == 0
    kinds = _event_kinds(jw, job.id)
    assert "progress-stalled" in kinds and "progress-recovered" in kinds
    delivered = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    trouble = [e for e in delivered if e["event"] in ("stalled", "recovered")]  # a `slowed` may come too
    assert [e["event"] for e in trouble] == ["stalled", "recovered"]
    assert "no step for" in trouble[0]["text"]


def _event_kinds(jw: Jobwarden, job: int) -> list[str]:
    with Store(jw.home) as store:
        return [e.kind for e in store.events(job)]


# --- /metrics ---------------------------------------------------------------------------------------------


def test_prometheus_exports_progress_and_promtool_accepts_it(
    jw: Jobwarden, tmp_path: Path, finish: list[Held]
) -> None:
    require("tqdm")
    job = Held(jw, tmp_path, "nested")  # an epoch bar around a bar of batches: the ratio is the run's
    finish.append(job)
    job.wait_ready()
    wait_progress(jw, job.id, "at 106 of epoch 2", lambda p: (p.epoch, p.step) == (2.0, 106))
    text = jw("metrics", str(job.id), "--prometheus", check=True).stdout
    with Store(jw.home) as store:  # what /metrics serves: every job
        served = exposition(store, ProcFS(), time.time())
    assert f'jobwarden_job_progress_step{{job_id="{job.id}"}} 106' in served
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["jobwarden_job_progress_step"] == 106
    assert values["jobwarden_job_progress_total"] == 128
    assert values["jobwarden_job_progress_ratio"] == pytest.approx((128 + 106) / 384)
    assert values["jobwarden_job_step_rate"] > 0 and values["jobwarden_job_eta_seconds"] > 0
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    promtool_check(text)
    promtool_check(served)
