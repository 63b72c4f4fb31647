"""The progress of the run, not of its inner bar (issue 28, items 1-3), from real jobs through the real CLI:
nested tqdm bars and a PyTorch Lightning fit in epoch 2 of 3 give the epoch, the run's fraction and an
ETA to the end of training in `ps --json` and the ps table; a loop's own prints are read; a bar seen
in-process keeps the loss of the Trainer's dicts beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.test_progress import Held, finish, ps_json, ps_row, require, wait_progress

__all__ = ["finish"]  # the fixture, used by name

pytestmark = pytest.mark.integration


def test_nested_tqdm_bars_in_epoch_2_of_3(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    require("tqdm")
    job = Held(jw, tmp_path, "nested")
    finish.append(job)
    job.wait_ready()
    wait_progress(jw, job.id, "at 106 of the 2nd epoch", lambda p: (p.epoch, p.step) == (2.0, 106))
    listed = ps_json(jw, job.id)["progress"]
    assert (listed["step"], listed["total"], listed["epoch"]) == (106, 128, {"n": 2, "total": 3})
    # the run: a whole epoch of 128 done, 106 of the 2nd, a 3rd ahead; the ETA counts all that is left
    assert listed["fraction"] == pytest.approx((128 + 106) / 384, abs=1e-3)
    assert listed["rate"] and listed["eta_s"] == pytest.approx(
        (384 - 234) / listed["rate"], rel=0.02, abs=0.2
    )
    row = ps_row(jw, job.id)
    assert "ep 2/3 83% 106/128" in row and "ETA" in row
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    ended = jw.status(job.id)["progress"]
    assert (ended["fraction"], ended["eta_s"]) == (1.0, None)


@pytest.mark.timeout(300)  # Lightning and torch take long to import on a loaded 2-core machine
def test_lightning_in_epoch_2_of_3(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    """Lightning's tqdm bar says "Epoch 1" (0-based) and never how many epochs: the script's
    `--max_epochs 3` says, as a user passes it."""
    require("pytorch_lightning")
    job = Held(jw, tmp_path, "lightning", "tqdm", "--max_epochs", "3")
    finish.append(job)
    job.wait_ready()
    got = wait_progress(jw, job.id, "at 8 of epoch 2", lambda p: (p.epoch, p.step, p.total) == (2.0, 8, 16))
    assert got.label == "Epoch 1" and got.epochs == 3
    listed = ps_json(jw, job.id)["progress"]
    assert listed["epoch"] == {"n": 2, "total": 3}
    assert listed["fraction"] == pytest.approx((16 + 8) / 48, abs=1e-3)
    assert listed["rate"] and listed["eta_s"] == pytest.approx((48 - 24) / listed["rate"], rel=0.02, abs=0.2)
    assert "ep 2/3 50% 8/16" in ps_row(jw, job.id)
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
    ended = jw.status(job.id)["progress"]
    assert (ended["fraction"], ended["epoch"]) == (1.0, {"n": 3, "total": 3})


def test_a_loops_own_prints(jw: Jobwarden, tmp_path: Path, finish: list[Held]) -> None:
    job = Held(jw, tmp_path, "homemade")
    finish.append(job)
    job.wait_ready()
    wait_progress(jw, job.id, "at step 30 of epoch 2", lambda p: (p.epoch, p.step) == (2.0, 30))
    listed = ps_json(jw, job.id)["progress"]
    assert (listed["format"], listed["total"], listed["epoch"]) == ("plain", 50, {"n": 2, "total": 3})
    assert listed["metrics"] == {"loss": pytest.approx(0.0167), "lr": pytest.approx(1e-4)}
    assert listed["fraction"] == pytest.approx(80 / 150, abs=1e-3)
    assert "ep 2/3 60% 30/50" in ps_row(jw, job.id)
    job.go()
    assert jw("wait", str(job.id)).returncode == 0


def test_the_trainers_dicts_beside_a_bar_seen_in_process(
    jw: Jobwarden, tmp_path: Path, finish: list[Held]
) -> None:
    """The step from the hooks' exact bar, the loss from the dicts in the log: both."""
    require("tqdm")
    job = Held(jw, tmp_path, "hf-tqdm")
    finish.append(job)
    job.wait_ready()
    got = wait_progress(jw, job.id, "at 12 with a loss", lambda p: p.step == 12 and p.loss is not None)
    assert (got.observed, got.format) == ("in-process", "hf")
    listed = ps_json(jw, job.id)["progress"]
    assert listed["metrics"]["loss"] == pytest.approx(0.06) and listed["epoch"] == {"n": 1, "total": None}
    job.go()
    assert jw("wait", str(job.id)).returncode == 0
