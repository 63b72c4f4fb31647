"""The shim's progress watch, fed real files on a clock the test moves: the log's newest bytes only, the
rate on the shim's clock, the stored progress, `stalled` and `recovered`, and the hang watchdog that
trusts a running step counter over CPU."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.clock import FakeClock
from jobwarden.joboptions import JobOptions
from jobwarden.model import JobSpec, JobState
from jobwarden.shim.record.recorder import RunRecorder
from jobwarden.shim.watch.progresswatch import TAIL_BYTES, OutputTail, ProgressWatch, StepSign
from jobwarden.shim.watch.watchdog import Progress, ProgressTracker
from jobwarden.store import JobRecord, Store
from jobwarden.store.logfiles import LogWatcher


def frame(n: int, total: int = 1000) -> bytes:
    bar = f"train: {n * 100 // total:3d}%|█▌        | {n}/{total}"
    return f"\r{bar} [00:01<00:02, 5.40it/s, loss={1 / (n + 1):.3g}]".encode()


class Notes:
    """What the watch asks the notifier to deliver (the test's stand-in for webhooks)."""

    def __init__(self) -> None:
        self.delivered: list[dict[str, object]] = []

    def deliver(self, event: dict[str, object]) -> None:
        self.delivered.append(event)


class Watched:
    def __init__(self, store: Store, job: JobRecord, clock: FakeClock, window_s: float | None) -> None:
        self.store, self.job, self.clock = store, job, clock
        self.log = store.layout.output_log(job.id, 1)
        self.notes = Notes()
        record = RunRecorder(
            store, job.id, 1, LogWatcher(self.log, store.layout.output_index(job.id, 1)), clock
        )
        self.watch = ProgressWatch(store, job, 1, record, window_s, self.notes)  # type: ignore[arg-type]

    def write(self, data: bytes) -> None:
        with open(self.log, "ab") as fh:
            fh.write(data)

    def tick(self, seconds: float = 1.0, busy: bool = True) -> Any:
        self.clock.advance(seconds)
        return self.watch.tick(self.clock.wall(), self.clock.monotonic(), [], busy)

    def events(self) -> list[str]:
        return [e.kind for e in self.store.events(self.job.id, 1) if e.kind.startswith("progress-")]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def watched(store: Store, window_s: float | None = 600.0, py_hooks: bool = True) -> Watched:
    job_id, _ = store.create_job(JobSpec(("python", "t.py"), "/tmp", "t", {}), {}, 1.0, JobState.RUNNING)
    job = store.job(job_id)._replace(options=JobOptions(py_hooks=py_hooks))
    return Watched(store, job, FakeClock(), window_s)


def test_only_the_newest_bytes_of_a_fast_log_are_read(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"".join(frame(n, 10**6) for n in range(40_000)))  # ~3 MB of frames
    tail = OutputTail(log)
    got = tail.read()
    assert got is not None
    text, follows = got
    assert not follows and len(text.encode()) <= TAIL_BYTES + 1
    assert text.endswith("39999/1000000 [00:01<00:02, 5.40it/s, loss=2.5e-05]")
    assert tail.read() is None  # nothing new
    with open(log, "ab") as fh:
        fh.write(frame(40_000, 10**6))
    again = tail.read()
    assert again is not None and again[1] and again[0] == frame(40_000, 10**6).decode()


def test_the_rate_is_the_shims_own_and_the_progress_is_stored(store: Store) -> None:
    w = watched(store)
    for second in range(12):
        w.write(frame(second * 50))  # 50 steps a second on the test's clock, whatever the bar says
        p = w.tick()
    assert p is not None and (p.step, p.total, p.label, p.format, p.observed) == (
        550,
        1000,
        "train",
        "tqdm",
        "log",
    )
    assert p.rate == pytest.approx(50.0)
    assert p.eta_s == pytest.approx(9.0)
    stored = store.progress(w.job.id, 1)
    assert stored is not None and stored.step == 550 and stored.first_step == 0
    assert dict(stored.metrics)["loss"] == pytest.approx(1 / 551, rel=1e-2)


def test_a_counter_that_stops_while_busy_is_stalled_then_recovers(store: Store) -> None:
    w = watched(store, window_s=6.0)
    for second in range(10):
        w.write(frame(second * 10))
        w.tick()
    assert w.watch.counting()
    for _ in range(5):
        assert w.tick().stalled_since is None  # a pause, not yet a stall
    p = w.tick()
    assert p.stalled_since == pytest.approx(w.clock.wall() - 6.0)
    assert w.events() == ["progress-stalled"]
    assert w.notes.delivered[-1]["event"] == "stalled"
    assert "step 90/1000" in str(w.notes.delivered[-1]["finding"])
    assert store.progress(w.job.id, 1).stalled_since is not None  # type: ignore[union-attr]
    w.tick()
    assert w.events() == ["progress-stalled"]  # once a spell
    w.write(frame(100))
    assert w.tick().stalled_since is None
    assert w.events() == ["progress-stalled", "progress-recovered"]
    assert [e["event"] for e in w.notes.delivered] == ["stalled", "recovered"]


def test_a_counter_that_stops_while_the_job_idles_is_the_hang_watchdogs_not_a_stall(store: Store) -> None:
    w = watched(store, window_s=6.0)
    for second in range(10):
        w.write(frame(second * 10))
        w.tick()
    for _ in range(20):
        w.tick(busy=False)
    assert w.events() == []


def test_a_finished_bar_is_no_running_counter(store: Store) -> None:
    w = watched(store, window_s=6.0)
    for n in range(0, 1001, 100):
        w.write(frame(n))
        w.tick()
    w.write(b"\n")  # closed
    w.tick()
    assert not w.watch.counting()
    for _ in range(20):
        w.tick()
    assert w.events() == []


def test_a_counter_too_slow_for_the_window_is_not_trusted(store: Store) -> None:
    w = watched(store, window_s=6.0)
    for step in range(6):
        w.write(frame(step))
        w.tick(3.0)  # a step every 3 s: a 6 s window holds two, too few to call a stop a hang
    assert not w.watch.counting()


def test_the_watchdog_counts_only_the_step_counter_while_one_runs(store: Store) -> None:
    w = watched(store, window_s=6.0)
    sign = StepSign(w.watch)
    tracker = ProgressTracker(6.0, w.clock.monotonic())
    for second in range(10):
        w.write(frame(second * 10))
        w.tick()
        active, moved = sign.read()
        tracker.observe(
            w.clock.monotonic(), Progress(cpu_percent=100.0, step_active=active, step_moved=moved)
        )
    assert active and moved
    for _ in range(6):  # a spin: the CPU burns, the bar's monitor reprints the same frame
        w.write(frame(90))
        w.tick()
        active, moved = sign.read()
        kind = tracker.observe(
            w.clock.monotonic(), Progress(cpu_percent=100.0, step_active=active, step_moved=moved)
        )
        assert kind is None
    assert tracker.hang_due(w.clock.monotonic())
    assert "stands at step 90/1000 (9%), unmoved for 6s" in (sign.note(w.clock.monotonic()) or "")


def test_the_records_of_the_hooks_win_and_the_end_reads_those_of_ended_processes(store: Store) -> None:
    w = watched(store)
    py_dir = store.layout.py_dir(w.job.id, 1)
    py_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": 4242,
        "rank": None,
        "at": 5.0,
        "epoch": None,
        "bars": [
            {
                "kind": "tqdm",
                "n": 620,
                "total": 1000,
                "unit": "it",
                "desc": "Epoch 3",
                "pos": 0,
                "closed": False,
                "postfix": "loss=0.5",
            }
        ],
    }
    (py_dir / "4242.progress").write_text(json.dumps(record))
    w.write(frame(600))
    w.clock.advance(1.0)
    p = w.watch.tick(w.clock.wall(), w.clock.monotonic(), [4242], True)
    assert p is not None and (p.step, p.observed, p.label) == (620, "in-process", "Epoch 3")
    # the process ended: its record is not a live bar any more, but the end reads it: how far it got
    w.clock.advance(1.0)
    assert w.watch.tick(w.clock.wall(), w.clock.monotonic(), [], True).observed == "log"
    w.watch.finish(w.clock.wall(), w.clock.monotonic())
    final = store.progress(w.job.id, 1)
    assert final is not None and (final.step, final.observed) == (620, "in-process")


def test_without_hooks_the_log_and_the_heartbeat_only(store: Store) -> None:
    w = watched(store, py_hooks=False)
    assert w.watch.py_dir is None
    heartbeat = store.layout.heartbeat_file(w.job.id, 1)
    heartbeat.write_text(json.dumps({"at": 3.0, "info": {"step": 85, "total": 1000, "loss": 0.0116}}))
    p = w.tick()
    assert p is not None and (p.step, p.total, p.source, p.format) == (85, 1000, "heartbeat", "heartbeat")
    assert dict(p.metrics) == {"loss": 0.0116}


def test_a_job_without_progress_has_none(store: Store) -> None:
    w = watched(store)
    w.write(b"epoch done\nsaving\n")
    assert w.tick() is None
    w.watch.finish(w.clock.wall(), w.clock.monotonic())
    assert store.progress(w.job.id, 1) is None
    assert not os.path.exists(store.layout.py_dir(w.job.id, 1) / "0.progress")


def test_each_ranks_own_heartbeat_gives_that_ranks_step(store: Store) -> None:
    """Issue 26: per-rank steps from each rank's heartbeat. The job's file keeps whichever rank beat last;
    `<heartbeat>.rank<N>` is each rank's own, read again only when it changed."""
    w = watched(store)
    beat = store.layout.heartbeat_file(w.job.id, 1)
    beat.parent.mkdir(parents=True, exist_ok=True)
    for rank, step in ((0, 120), (1, 40)):
        beat.with_name(f"heartbeat.rank{rank}").write_text(json.dumps({"at": 1.0, "info": {"step": step}}))
    beat.with_name("heartbeat.rank2").write_text(json.dumps({"at": 1.0, "info": {"loss": 0.5}}))  # no step
    beat.with_name("heartbeat.rankx").write_text("{}")  # not a rank
    assert w.watch.rank_hints().beat_steps == {0: 120, 1: 40}
    rank1 = beat.with_name("heartbeat.rank1")
    rank1.write_text(json.dumps({"at": 2.0, "info": {"step": 41}}))
    os.utime(rank1, (5.0, 5.0))  # a new mtime: read again
    assert w.watch.rank_hints().beat_steps == {0: 120, 1: 41}
