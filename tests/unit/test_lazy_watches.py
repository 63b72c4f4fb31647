"""The progress watch starts at the run's first sign of progress, not before (issue 25): a job that only
waits in silence never has its supervisor load the progress parsers. Driven through the fake OS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.looprig import Rig, refuse_processes


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_processes(monkeypatch)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    made.sup.close()


def test_a_silent_job_gets_no_progress_watch(rig: Rig) -> None:
    seen: list[object] = []
    rig.fake.at(20, lambda: seen.append(rig.sup.progress))
    rig.fake.at(30, lambda: rig.fake.exit(rig.main, 0))
    rig.launch()
    assert seen == [None] and rig.sup.progress is None


def test_the_watch_starts_at_the_first_output_and_reads_what_came_before(rig: Rig) -> None:
    log = rig.store.layout.output_log(rig.job_id, rig.run_n)
    seen: list[object] = []

    def prints() -> None:
        with open(log, "a") as out:
            out.write("Epoch 1/3 | step 10/50 | loss 0.1\n")

    rig.fake.at(10, lambda: seen.append(rig.sup.progress))
    rig.fake.at(12, prints)
    rig.fake.at(20, lambda: seen.append(rig.sup.progress))
    rig.fake.at(30, lambda: rig.fake.exit(rig.main, 0))
    rig.launch()
    assert seen[0] is None and seen[1] is not None
    progress = rig.store.progress(rig.job_id, rig.run_n)
    assert progress is not None and progress.step == 10


def test_a_job_that_printed_and_ended_before_a_tick_has_its_progress(rig: Rig) -> None:
    log = rig.store.layout.output_log(rig.job_id, rig.run_n)

    def prints_and_ends() -> None:
        with open(log, "a") as out:
            out.write("step 7/50\n")
        rig.fake.exit(rig.main, 0)

    rig.fake.at(0.2, prints_and_ends)
    rig.launch()
    progress = rig.store.progress(rig.job_id, rig.run_n)
    assert progress is not None and progress.step == 7
