"""The hang watchdog's progress tracking: what counts as progress, and when a hang is due."""

from __future__ import annotations

from pathlib import Path

from jobwarden.shim.watch.watchdog import Progress, ProgressTracker
from jobwarden.verdict.signs import CPU_FLOOR_PERCENT


def test_a_quiet_run_is_due_once_the_window_passes() -> None:
    t = ProgressTracker(window_s=60, now=0)
    t.observe(1, Progress(output_bytes=10, cpu_percent=0.0))
    assert not t.hang_due(59)
    assert t.hang_due(60)
    assert t.quiet_for(75) == 75


def test_a_hang_is_reported_once_per_quiet_spell() -> None:
    t = ProgressTracker(window_s=10, now=0)
    assert t.hang_due(10)
    t.mark_reported()
    assert not t.hang_due(30)
    t.observe(31, Progress(cpu_percent=90.0))  # it moved again: the next quiet spell is a new hang
    assert not t.hang_due(40)
    assert t.hang_due(41)


def test_new_output_is_progress_but_the_first_reading_is_a_baseline() -> None:
    t = ProgressTracker(window_s=10, now=0)
    assert t.observe(1, Progress(output_bytes=500)) is None
    assert t.observe(2, Progress(output_bytes=500)) is None
    assert t.observe(3, Progress(output_bytes=501)) == "output"
    assert t.last_progress_at == 3 and t.last_kind == "output"


def test_an_unknown_reading_keeps_the_previous_one() -> None:
    t = ProgressTracker(window_s=10, now=0)
    t.observe(1, Progress(output_bytes=500))
    t.observe(2, Progress(output_bytes=None))  # the log could not be read this time
    assert t.observe(3, Progress(output_bytes=600)) == "output"


def test_a_heartbeat_is_progress() -> None:
    t = ProgressTracker(window_s=10, now=0)
    t.observe(1, Progress(heartbeat_at=100.0))
    assert t.observe(9, Progress(heartbeat_at=108.0)) == "heartbeat"
    assert not t.hang_due(18)


def test_cpu_counts_only_above_the_floor() -> None:
    t = ProgressTracker(window_s=10, now=0)
    # an idle Pool parent: its worker-handler thread wakes ten times a second
    assert t.observe(5, Progress(cpu_percent=0.4)) is None
    assert t.hang_due(10)
    assert t.observe(11, Progress(cpu_percent=CPU_FLOOR_PERCENT)) == "cpu"


def test_io_counts_by_its_growth_above_the_floor() -> None:
    t = ProgressTracker(window_s=10, now=0)
    t.observe(1, Progress(io_bytes=1_000_000))
    assert t.observe(2, Progress(io_bytes=1_000_100)) is None
    assert t.observe(3, Progress(io_bytes=1_100_000)) == "io"


def test_gpu_work_is_progress() -> None:
    t = ProgressTracker(window_s=10, now=0)
    assert t.observe(1, Progress(gpu_util_percent=1.0)) is None
    assert t.observe(2, Progress(gpu_util_percent=97.0)) == "gpu"


def test_no_window_never_hangs() -> None:
    t = ProgressTracker(window_s=None, now=0)
    assert not t.hang_due(10**9)


def test_due_at_is_the_end_of_the_window_until_reported() -> None:
    t = ProgressTracker(window_s=10, now=0)
    t.observe(4, Progress(output_bytes=1))
    t.observe(5, Progress(output_bytes=2))  # progress at 5
    assert t.due_at() == 15
    t.mark_reported()
    assert t.due_at() is None
    assert ProgressTracker(window_s=None, now=0).due_at() is None


def test_io_read_every_few_ticks_counts_against_the_last_reading() -> None:
    # the shim reads /proc/PID/io only every few ticks; the ticks between carry no I/O reading, and a job
    # that only writes (and fsyncs) its data, printing nothing, must still be seen moving
    t = ProgressTracker(window_s=9, now=0)
    t.observe(1, Progress(output_bytes=0, io_bytes=1_000_000))
    for now in (2, 3):
        assert t.observe(now, Progress(output_bytes=0)) is None
    assert t.observe(4, Progress(output_bytes=0, io_bytes=4_600_000)) == "io"
    assert not t.hang_due(12)


def test_the_work_of_answering_jobwardens_own_probe_is_no_progress() -> None:
    # a hung rank asked for its flight recorder symbolises stacks (CPU) and writes its answer (I/O)
    t = ProgressTracker(window_s=10, now=0)
    t.observe(1, Progress(output_bytes=5, io_bytes=1000))
    t.discount(until=20)
    assert t.observe(12, Progress(output_bytes=5, cpu_percent=95.0)) is None
    assert t.observe(15, Progress(output_bytes=5, io_bytes=50_000)) is None  # its answer, written
    assert t.observe(16, Progress(output_bytes=6)) == "output"  # the job's own output still counts
    assert t.observe(21, Progress(output_bytes=6, io_bytes=60_000)) is None  # first reading after: a baseline
    assert t.observe(26, Progress(output_bytes=6, cpu_percent=95.0)) == "cpu"
    assert t.observe(27, Progress(output_bytes=6, io_bytes=70_000)) == "io"


def test_the_diagnosis_notices_a_ranks_answer_to_any_recorder_request(tmp_path: Path) -> None:
    # `jobwarden dump` asks too, from another process: the shim sees the answer's file change
    import os
    import types

    from jobwarden.shim.watch.diagnosis import Diagnoser

    me = types.SimpleNamespace(tree=types.SimpleNamespace(members={7: 1, 8: 1}), py_dir=tmp_path)
    me._recorder_answers = {}
    answered = lambda: Diagnoser._recorder_answered(me)  # type: ignore[arg-type]  # noqa: E731
    assert not answered()  # no rank has answered anything
    (tmp_path / "7.fr.json").write_text("{}")
    assert answered()
    assert not answered()  # the same answer, seen already
    os.utime(tmp_path / "7.fr.json", ns=(1, 1))
    assert answered()
    # the rank watch's poll, every 10 s: its answer costs no I/O (test_rank_arrivals.py), and a discount
    # every 10 s would leave a job whose only progress is I/O looking hung
    (tmp_path / "8.fr.poll.json").write_text("{}")
    assert not answered()
