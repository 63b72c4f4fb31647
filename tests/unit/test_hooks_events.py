"""What the hooks tell the shim (births, reaped children) and record (the first uncaught exception, torchrun's
error file), tested on the hook functions inside this process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.hooks.site import _jobwarden_hooks as injected
from jobwarden.probes.pyhooks import read_exceptions
from jobwarden.shim.tree.sightings import Birth, Death, open_fifo, parse_announcement

from .test_hooks import job_at


def lines_of(fd: int) -> list[bytes]:
    try:
        return os.read(fd, 1 << 16).splitlines()
    except BlockingIOError:  # nothing written
        return []


def test_a_birth_is_one_line_the_shim_parses(tmp_path: Path) -> None:
    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    job = job_at(tmp_path)
    try:
        injected._announce(job, injected.birth_line(4242, 777))
        (line,) = lines_of(reader)
        births: list[Birth] = []
        parse_announcement(line, births, [])
        assert births == [Birth(4242, os.getppid(), 777, None, announced=True)]
    finally:
        os.close(reader)
        if job.events_fd >= 0:
            os.close(job.events_fd)


def test_without_a_fifo_the_announcement_is_dropped_once_and_for_all(tmp_path: Path) -> None:
    job = job_at(tmp_path)
    injected._announce(job, injected.birth_line(1, 1))
    assert job.events_fd == -2  # no shim's run here: never tried again


def test_a_full_fifo_of_a_dead_shim_neither_blocks_nor_kills(tmp_path: Path) -> None:
    # the shim is gone: its FIFO fills; a job that set SIGPIPE to SIG_DFL must not die of a write
    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    os.close(reader)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    job = job_at(tmp_path)
    try:
        for _ in range(5000):  # far past the 64 KiB of a pipe
            injected._announce(job, injected.birth_line(1, 1))
    finally:
        signal.signal(signal.SIGPIPE, previous)
        os.close(job.events_fd)


def test_a_reaped_child_is_reported_with_its_wait_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    job = job_at(tmp_path)
    monkeypatch.setattr(injected, "_job", job)
    try:
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        original = os.waitpid
        injected._wrap_waits()
        try:
            assert os.waitpid(pid, 0) == (pid, signal.SIGKILL)  # what the caller gets is unchanged
        finally:
            os.waitpid = original
            monkeypatch.undo()
        deaths: list[Death] = []
        for line in lines_of(reader):
            parse_announcement(line, [], deaths)
        (death,) = deaths
        assert (death.pid, death.ppid, death.status) == (pid, os.getpid(), signal.SIGKILL)
    finally:
        os.close(reader)
        if job.events_fd >= 0:
            os.close(job.events_fd)


def test_clean_exits_are_reported_together_and_a_failure_at_once(tmp_path: Path) -> None:
    """A fork loop beside busy threads must not pay a GIL hand-over per reaped child: clean exits wait
    (for a failure, REAPED_BATCH of them, REAPED_WAIT_S, or the exit), a failure goes at once with them."""
    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    job = job_at(tmp_path)
    saved = injected._job
    injected._job = job
    try:
        injected._reaped(101, 0)
        injected._reaped(102, 0)
        assert lines_of(reader) == []
        injected._reaped(103, 3 << 8)
        deaths: list[Death] = []
        for line in lines_of(reader):
            parse_announcement(line, [], deaths)
        assert [(d.pid, d.ppid, d.status) for d in deaths] == [
            (101, os.getpid(), 0),
            (102, os.getpid(), 0),
            (103, os.getpid(), 3 << 8),
        ]
        for pid in range(injected.REAPED_BATCH):
            injected._reaped(200 + pid, 0)
        assert len(lines_of(reader)) == injected.REAPED_BATCH
        injected._reaped(300, 0)
        injected._flush_left()  # at exit
        assert [line.split()[2] for line in lines_of(reader)] == [b"300"]
    finally:
        injected._job = saved
        os.close(reader)
        if job.events_fd >= 0:
            os.close(job.events_fd)


def test_the_wrapped_waits_raise_as_the_originals() -> None:
    originals = (os.waitpid, os.wait, os.wait3, os.wait4, os.waitid)
    injected._wrap_waits()
    pid = None
    try:
        with pytest.raises(ChildProcessError):  # our own pid is never our child (any pid: the session's
            os.waitpid(os.getpid(), os.WNOHANG)  # Slurm and Ray fixtures are children of this process)
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        assert os.waitpid(pid, os.WNOHANG) in ((0, 0), (pid, 3 << 8))  # WNOHANG's (0, 0) passes through
    finally:
        os.waitpid, os.wait, os.wait3, os.wait4, os.waitid = originals
        if pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("CLD_EXITED", 3, 3 << 8),
        ("CLD_KILLED", 9, 9),
        ("CLD_DUMPED", 11, 11 | 0x80),
        ("CLD_STOPPED", 19, None),
    ],
)
def test_waitid_results_become_wait_statuses(code: str, status: int, expected: int | None) -> None:
    info = SimpleNamespace(si_code=getattr(os, code), si_status=status, si_pid=5)
    assert injected.status_of_waitid(info) == expected


def chained_error() -> BaseException:
    try:
        try:
            raise KeyError("shard 7")
        except KeyError as inner:
            raise RuntimeError("x" * 5000) from inner
    except RuntimeError as err:
        return err


def test_the_exception_record_has_type_frames_and_chain(tmp_path: Path) -> None:
    job = job_at(tmp_path)
    exc = chained_error()
    injected._record_exception(job, exc)
    injected._record_exception(job, ValueError("second"))  # only the first is the process's
    (record,) = read_exceptions(tmp_path)
    assert (record.pid, record.type, len(record.message)) == (os.getpid(), "RuntimeError", 4000)
    assert record.chain == (("KeyError", "'shard 7'"),)
    assert record.frames[0].function == "chained_error"  # innermost first


def test_torchruns_error_file_is_written_as_record_would_and_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    job = job_at(tmp_path)
    job.error_file_owner = os.getpid()
    injected._record_exception(job, ValueError("loss is nan"))
    written = json.loads(error_file.read_text())
    assert written["message"]["message"] == "ValueError: loss is nan"
    assert "ValueError: loss is nan" in written["message"]["extraInfo"]["py_callstack"]
    assert written["message"]["extraInfo"]["timestamp"].isdigit()
    error_file.write_text("{}")  # @record wrote its own: left alone
    job.exception_seen = False
    injected._record_exception(job, ValueError("again"))
    assert error_file.read_text() == "{}"


def test_a_child_of_the_rank_does_not_write_the_ranks_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    job = job_at(tmp_path)
    job.error_file_owner = os.getppid()  # the rank is this process's parent
    injected._record_exception(job, ValueError("in a DataLoader worker"))
    assert not error_file.exists()


def test_the_excepthook_still_prints_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_at(tmp_path)
    previous = sys.excepthook
    injected._install_excepthook(job)
    try:
        exc = chained_error()
        sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        sys.excepthook = previous
    assert "RuntimeError" in capsys.readouterr().err
    assert read_exceptions(tmp_path)[0].type == "RuntimeError"


# --- exceptions formatted without dying of them; the fork start method asked for by name ---------------


def worker_task_error() -> ValueError:
    try:
        raise ValueError("corrupt record 9")
    except ValueError as err:
        return err


def test_an_exception_a_process_formats_is_recorded_with_its_raise_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import traceback

    from jobwarden.probes.pyhooks import read_caught

    job = job_at(tmp_path)
    monkeypatch.setattr(injected, "_job", job)
    original = traceback.TracebackException.__init__
    try:
        injected.hook_traceback(traceback)
        injected.hook_traceback(traceback)  # hooked once: a second call changes nothing
        err = worker_task_error()
        text = "".join(
            traceback.format_exception(type(err), err, err.__traceback__)
        )  # what a pool's worker does
        assert "corrupt record 9" in text
    finally:
        traceback.TracebackException.__init__ = original  # type: ignore[method-assign]
    (record,) = read_caught(tmp_path)
    assert (record.pid, record.type, record.message) == (os.getpid(), "ValueError", "corrupt record 9")
    assert record.frames[0].function == "worker_task_error"  # innermost first


def test_caught_records_are_bounded_per_process(tmp_path: Path) -> None:
    from jobwarden.probes.pyhooks import read_caught

    job = job_at(tmp_path)
    err = worker_task_error()
    for _ in range(injected.CAUGHT_RECORDS + 10):
        injected.record_caught(job, ValueError, err, err.__traceback__)
    assert len(read_caught(tmp_path)) == injected.CAUGHT_RECORDS


def test_asking_for_fork_by_name_is_recorded_once_per_call_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import multiprocessing.context

    from jobwarden.probes.pyhooks import read_fork_requests

    job = job_at(tmp_path)
    monkeypatch.setattr(injected, "_job", job)
    original = multiprocessing.context.BaseContext.get_context
    try:
        injected.hook_multiprocessing(multiprocessing)
        for _ in range(3):
            multiprocessing.get_context("fork")  # this line, three times: one record
        multiprocessing.get_context("spawn")  # not fork: nothing to note
    finally:
        multiprocessing.context.BaseContext.get_context = original  # type: ignore[method-assign]
    (request,) = read_fork_requests(tmp_path)
    assert request.pid == os.getpid()
    outside = [f for f in request.stack if "/multiprocessing/" not in f.file]
    assert outside[0].file == __file__
    assert outside[0].function == "test_asking_for_fork_by_name_is_recorded_once_per_call_site"


@given(st.binary(max_size=2000))
def test_the_readers_of_the_new_records_take_any_bytes(data: bytes) -> None:
    import tempfile

    from jobwarden.probes.pyhooks import read_caught, read_fork_requests

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "42.caught.jsonl").write_bytes(data)
        Path(folder, "42.start-method.jsonl").write_bytes(data)
        for record in read_caught(Path(folder)):
            assert isinstance(record.type, str)
        for request in read_fork_requests(Path(folder)):
            assert isinstance(request.pid, int)


# --- adverts go through the shim -----------------------------------------------------------------------


def test_an_advert_is_announced_and_the_shim_writes_it_in_order(tmp_path: Path) -> None:
    """The hooks announce their advert rather than creating a file (0.2 ms of every forked child); the
    shim writes what it reads. A withdrawal is announced, then written at once by the process itself."""
    from jobwarden.osapi.procfs import ProcFS
    from jobwarden.shim.tree.pyfiles import PyFiles

    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    job = job_at(tmp_path)
    advert_file = tmp_path / f"{os.getpid()}.json"
    try:
        injected.write_advert(job, os.getpid(), "", True, 777)
        assert not advert_file.exists()  # announced only
        adverts: list[bytes] = []
        for line in lines_of(reader):
            parse_announcement(line, [], [], adverts)
        files = PyFiles(tmp_path, ProcFS())
        (announced,) = adverts
        files.store_advert(announced)
        assert json.loads(advert_file.read_text()) == job.advert
        assert {p.name for p in tmp_path.iterdir()} == {advert_file.name, injected.EVENTS_FIFO}

        injected._fault_signal_taken(job, 0)  # the job set SIG_DFL on the fault signal
        withdrawn = json.loads(advert_file.read_text())  # written at once, by the process itself
        assert withdrawn["fault_withdrawn"] and withdrawn["fault_signal"] == 0
        (line,) = lines_of(reader)
        files.store_advert(announced)  # the birth advert, read late: never over the withdrawal
        assert json.loads(advert_file.read_text()) == withdrawn
        files.store_advert(line.removeprefix(b"advert "))
        assert json.loads(advert_file.read_text()) == withdrawn
    finally:
        os.close(reader)
        if job.events_fd >= 0:
            os.close(job.events_fd)


def test_without_a_shim_the_advert_is_written_by_the_process(tmp_path: Path) -> None:
    job = job_at(tmp_path)
    injected.write_advert(job, os.getpid(), "", True, 777)
    assert json.loads((tmp_path / f"{os.getpid()}.json").read_text()) == job.advert


def test_settling_waits_for_the_shim_to_read_what_was_announced(tmp_path: Path) -> None:
    from jobwarden.probes.pyhooks import settle_adverts

    assert settle_adverts(tmp_path)  # no FIFO: nothing in flight
    reader = open_fifo(tmp_path / injected.EVENTS_FIFO)
    assert reader is not None
    try:
        assert settle_adverts(tmp_path)  # empty
        os.write(reader, b"advert {}\n")  # O_RDWR: written and left unread, as by a shim that is gone
        assert not settle_adverts(tmp_path, timeout_s=0.05)
        lines_of(reader)
        assert settle_adverts(tmp_path, timeout_s=0.05)
    finally:
        os.close(reader)


def test_a_rank_announced_after_the_kernels_fork_event_is_kept() -> None:
    """The kernel's fork event made the process a member before its exec gave it RANK; the hooks' `born`
    line, which names the rank, comes after: the member takes the rank, if it is the same process."""
    from jobwarden.model import ProcessId, Ranks
    from jobwarden.shim.tree.exits import ExitCollector

    held = SimpleNamespace(ident=ProcessId(4242, 500), ranks=None)
    collector = ExitCollector(SimpleNamespace(members={4242: held}))  # type: ignore[arg-type]
    collector._on_birth(Birth(4242, 1, 999, Ranks(0), announced=True))  # a reused pid: another process
    assert held.ranks is None
    collector._on_birth(Birth(4242, 1, 500, Ranks(0), announced=True))
    assert held.ranks == Ranks(0)


def test_a_child_held_at_its_fork_is_read_again_once_the_filter_follows_it() -> None:
    """The kernel's filter passes the exec of followed processes only: a child held at its fork event that
    execs before the filter follows it is refreshed right after (its new command and RANK)."""
    from jobwarden.model import ProcessId
    from jobwarden.shim.tree.exits import ExitCollector

    calls: list[tuple[str, int]] = []
    members: dict[int, object] = {100: SimpleNamespace(ident=ProcessId(100, 1), ranks=None)}

    def add_pid(pid: int, start_time: int | None = None) -> object:
        calls.append(("add", pid))
        members[pid] = SimpleNamespace(ident=ProcessId(pid, 2), ranks=None)
        return members[pid]

    tree = SimpleNamespace(
        members=members, add_pid=add_pid, refresh=lambda pid: calls.append(("refresh", pid))
    )
    sightings = SimpleNamespace(follow=lambda pids, born_after: calls.append(("follow", len(pids))))
    collector = ExitCollector(tree, sightings)  # type: ignore[arg-type]
    collector._on_birth(Birth(4243, 100, None))  # the kernel's fork event: a child of a member
    assert calls == [("add", 4243)]
    collector.follow(born_after=7)
    assert calls == [("add", 4243), ("follow", 2), ("refresh", 4243)]  # read again after, not before
    collector.follow(born_after=8)
    assert calls[-1] == ("follow", 2)  # once
