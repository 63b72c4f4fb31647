"""The hooks read progress bars inside the job's interpreters (3.8, 3.13 and the one running the tests):
real tqdm (the venv's copy, pure Python, on the job's path), real Keras 3 and rich; exact counts, the
postfix, nested positions, a closed bar; the job's result unchanged, nothing imported that the job did not
import, and a py dir the record cannot be written to never breaks it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.hooks import hook_env
from jobwarden.probes.pyhooks import read_progress
from tests.support import unavailable

pytestmark = pytest.mark.integration

INTERPRETERS = {
    "python3.8": Path.home() / ".pyenv/versions/3.8.18/bin/python",
    "python3.13": Path.home() / ".pyenv/versions/3.13.0/bin/python",
    "default": Path(sys.executable),
}
TIMEOUT_S = 120


def library(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        unavailable(f"{name} is not installed (the realworld extra)")
    return Path(next(iter(spec.submodule_search_locations)))


class Job:
    def __init__(self, python: Path, tmp: Path) -> None:
        self.python, self.tmp = python, tmp
        self.py_dir = tmp / "py"
        self.libs = tmp / "libs"  # the venv's pure-Python libraries, for the other interpreters too
        self.libs.mkdir()
        self.base = {
            k: v for k, v in os.environ.items() if not k.startswith("JOBWARDEN_") and k != "PYTHONPATH"
        }

    def with_library(self, name: str) -> None:
        shutil.copytree(library(name), self.libs / name)

    def run(self, source: str, hooked: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        base = {**self.base, "PYTHONPATH": str(self.libs), **extra}
        env = (
            {**base, **hook_env(self.py_dir, self.tmp / "heartbeat", os.getpid(), None, base)}
            if hooked
            else base
        )
        script = self.tmp / "job.py"
        script.write_text(textwrap.dedent(source))
        done = subprocess.run(
            [str(self.python), str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=self.tmp,
        )
        assert done.returncode == 0, done.stderr
        return done

    def record(self, pid: int) -> dict[str, object]:
        return dict(json.loads((self.py_dir / f"{pid}.progress").read_text()))


@pytest.fixture(params=list(INTERPRETERS))
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    path = INTERPRETERS[request.param]
    if not path.exists():
        pytest.skip(f"{path} is not installed (pyenv install {request.param.removeprefix('python')})")
    yield Job(path, tmp_path)


TQDM = """
    import os, sys, time
    from tqdm import tqdm, trange
    outer = tqdm(total=10, desc="Epoch 3", file=sys.stdout)
    with tqdm(total=400, desc="batches", leave=False, file=sys.stdout, position=1) as inner:
        for i in range(400):
            inner.set_postfix(loss=1.0 / (i + 1), refresh=False)
            inner.update(1)
        # a step of a real model's length: the last state is redrawn and recorded
        time.sleep(getattr(sys.modules.get("_jobwarden_hooks"), "PROGRESS_EVERY_S", 0) + 0.05)
        inner.refresh()
        record = open(os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.progress" % os.getpid())).read()
        print("RECORD " + record)
    outer.update(1)
    outer.close()
    print("sum", sum(x for x in tqdm(range(1000), file=sys.stdout)))
"""


def test_tqdm_bars_are_read_in_process(job: Job) -> None:
    job.with_library("tqdm")
    done = job.run(TQDM)
    assert "sum 499500" in done.stdout  # the job's own result, unchanged
    while_open = json.loads(done.stdout.split("RECORD ", 1)[1].splitlines()[0])
    bars = {b["desc"]: b for b in while_open["bars"]}
    assert bars["batches"]["n"] == 400 and bars["batches"]["pos"] == 1
    assert bars["batches"]["postfix"] == "loss=0.0025" and not bars["batches"]["closed"]
    assert bars["Epoch 3"]["n"] == 0 and bars["Epoch 3"]["pos"] == 0
    pid = int(while_open["pid"])
    final = read_progress(job.py_dir, pid)
    assert final is not None and final.rank is None
    assert [(b.n, b.total, b.closed) for b in final.bars if b.closed] == [(1000, 1000, True)]


def test_without_the_hooks_nothing_is_recorded(job: Job) -> None:
    job.with_library("tqdm")
    job.run(
        TQDM.replace(
            'record = open(os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.progress" % os.getpid())).read()',
            'record = "{}"',
        ),
        hooked=False,
    )
    assert not job.py_dir.exists()


def test_a_record_that_cannot_be_written_never_breaks_the_job(job: Job) -> None:
    job.with_library("tqdm")
    done = job.run(
        """
        import os, sys
        from tqdm import tqdm
        # where the record goes, a directory: every write of it fails (for root too)
        os.mkdir(os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.progress" % os.getpid()))
        print("sum", sum(x for x in tqdm(range(20000), file=sys.stdout, mininterval=0)))
        """
    )
    assert "sum 199990000" in done.stdout
    reports = [line for line in done.stderr.splitlines() if line.startswith("jobwarden:")]
    assert len(reports) == 1 and "python hook progress record failed" in reports[0]  # one line, no traceback


def test_the_hooks_import_no_progress_library(job: Job) -> None:
    job.with_library("tqdm")
    done = job.run(
        """
        import sys
        print(" ".join(m for m in ("tqdm", "tqdm.std", "keras", "rich", "rich.progress") if m in sys.modules))
        """
    )
    assert done.stdout.strip() == ""


def test_keras_and_its_epochs_are_read_in_process(tmp_path: Path) -> None:
    library("keras")
    job = Job(Path(sys.executable), tmp_path)
    done = job.run(
        """
        import os, sys, time
        os.environ["KERAS_BACKEND"] = "torch"
        import keras, numpy as np
        class Look(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 4:  # the next update is recorded
                    time.sleep(getattr(sys.modules.get("_jobwarden_hooks"), "PROGRESS_EVERY_S", 0) + 0.05)
                if batch == 5:
                    path = os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.progress" % os.getpid())
                    print("RECORD " + open(path).read(), file=sys.stderr)
        rng = np.random.default_rng(0)
        x, y = rng.random((64, 4), dtype="float32"), rng.random((64, 1), dtype="float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, epochs=2, batch_size=8, verbose=1, callbacks=[Look()])
        """,
        PYTHONPATH="",
    )
    records = [json.loads(line[7:]) for line in done.stderr.splitlines() if line.startswith("RECORD ")]
    [epoch1, epoch2] = records
    for record, epoch in ((epoch1, 1), (epoch2, 2)):
        [bar] = record["bars"]
        assert (bar["kind"], bar["n"], bar["total"], bar["unit"], record["epoch"]) == (
            "keras",
            5,
            8,
            "step",
            epoch,
        )
        assert set(bar["metrics"]) == {"loss"}


def test_rich_progress_is_read_in_process(tmp_path: Path) -> None:
    library("rich")
    job = Job(Path(sys.executable), tmp_path)
    done = job.run(
        """
        import os, sys, time
        from rich.progress import Progress
        with Progress() as progress:
            task = progress.add_task("[bold]Epoch 2/9", total=16)
            for i in range(7):
                if i == 6:  # the last advance is recorded
                    time.sleep(getattr(sys.modules.get("_jobwarden_hooks"), "PROGRESS_EVERY_S", 0) + 0.05)
                progress.advance(task)
            path = os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.progress" % os.getpid())
            print("RECORD " + open(path).read(), file=sys.stderr)
        """,
        PYTHONPATH="",
    )
    record = json.loads(done.stderr.split("RECORD ", 1)[1].splitlines()[0])
    [bar] = record["bars"]
    assert (bar["kind"], bar["n"], bar["total"], bar["desc"], bar["closed"]) == (
        "rich",
        7,
        16,
        "Epoch 2/9",
        False,
    )
