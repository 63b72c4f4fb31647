"""The ML-stack parsers against output recorded from the real libraries (tests/fixtures/mlstack, README
there): torch 2.13.0 DataLoader and torchrun, concurrent.futures, loky/joblib; GPU texts quoted from
public issue threads. Each parser is also held to saying nothing where it must not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobwarden.observations import Frame
from jobwarden.rules import mltext
from jobwarden.rules.mltext import (
    child_failed,
    dataloader_death,
    gpu_errors,
    parse_traceback,
    rank_tracebacks,
    signal_exception,
    user_frame,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "mlstack"
JOB = "/work/main/tests/integration/jobs/mlstack.py"  # where mlstack.py was when the logs were recorded
HEALTHY = ["fsync-checkpoint", "resource-tracker", "torchrun-fsync-checkpoint"]


def log(name: str) -> list[str]:
    return (FIXTURES / f"{name}.log").read_text().splitlines()


def agent_pid_of_failure(lines: list[str]) -> tuple[int, int]:
    """(local rank, pid) from the agent's own log line about the first failure: a second witness."""
    m = next(m for line in lines if (m := re.search(r"local_rank: (\d+) \(pid: (\d+)\) of binary", line)))
    return int(m[1]), int(m[2])


# --- child_failed -------------------------------------------------------------------------------------


def test_a_rank_that_raised_without_record_is_the_root_cause_with_no_error_file() -> None:
    lines = log("torchrun-rank-raises")
    report = child_failed(lines)
    assert report is not None
    root = report.root_cause
    assert report.name == "tests/integration/jobs/mlstack.py"
    assert (root.rank, root.local_rank, root.exitcode, root.signal) == (1, 1, 1, None)
    assert (root.local_rank, root.pid) == agent_pid_of_failure(lines)
    assert root.error_file is None
    assert root.message.startswith("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors")
    assert root.traceback is None
    assert root.host == "localhost"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", root.time)


def test_the_rank_torn_down_after_the_first_failure_is_another_failure_with_its_signal() -> None:
    report = child_failed(log("torchrun-rank-raises"))
    assert report is not None
    (other,) = report.other_failures
    assert (other.rank, other.exitcode, other.signal, other.error_file) == (0, -15, "SIGTERM", None)
    assert other.message == f"Signal 15 (SIGTERM) received by PID {other.pid}"


def test_under_record_the_root_cause_carries_the_traceback_from_its_error_file() -> None:
    report = child_failed(log("torchrun-rank-raises-record"))
    assert report is not None
    root = report.root_cause
    assert root.error_file is not None
    assert re.search(r"/torchelastic_\w+/none_\w+/attempt_0/1/error\.json$", root.error_file)
    assert root.traceback is not None
    assert root.traceback[:2] == ("ValueError", "bad batch shape (2, 3): expected (2, 4)")
    assert root.text[0] == "Traceback (most recent call last):"
    assert (
        root.text[-1] == "ValueError: bad batch shape (2, 3): expected (2, 4)"
    )  # the report's blank tail dropped
    assert user_frame(root.traceback.frames) == Frame("rank_raises", JOB, root.traceback.frames[0].line)


def test_under_record_a_torn_down_rank_keeps_its_own_traceback_and_its_sigterm() -> None:
    report = child_failed(log("torchrun-rank-raises-record"))
    assert report is not None
    (other,) = report.other_failures
    assert (other.exitcode, other.signal) == (-15, "SIGTERM")
    assert other.traceback is not None
    assert other.traceback.exc_type == "RuntimeError"
    assert "Connection closed by peer" in other.traceback.message


@pytest.mark.parametrize("name", ["torchrun-rank-killed", "torchrun-rank-killed-record"])
def test_a_killed_rank_has_its_signal_and_no_error_file_even_under_record(name: str) -> None:
    lines = log(name)
    report = child_failed(lines)
    assert report is not None
    root = report.root_cause
    assert (root.rank, root.exitcode, root.signal, root.error_file) == (1, -9, "SIGKILL", None)
    assert (root.local_rank, root.pid) == agent_pid_of_failure(lines)
    assert root.message == f"Signal 9 (SIGKILL) received by PID {root.pid}"


def test_a_rank_that_exited_with_a_code_is_the_root_cause() -> None:
    report = child_failed(log("torchrun-rank-hangs-bound"))
    assert report is not None
    assert (report.root_cause.rank, report.root_cause.exitcode, report.root_cause.signal) == (1, 3, None)


def test_an_older_report_without_signal_names_gets_them_from_the_exit_code() -> None:
    # torch < 2.5 printed "exitcode  : -9 (pid: N)" with no "(SIGKILL)" and had <NO_OTHER_FAILURES>
    lines = [re.sub(r"\)\s+\(SIG\w+\)$", ")", line) for line in log("torchrun-rank-killed")]
    lines = [line.replace("Signal 9 (SIGKILL) received", "signal received") for line in lines]
    start = lines.index("Failures:")
    lines[start + 1 : lines.index("Root Cause (first observed failure):") - 1] = ["  <NO_OTHER_FAILURES>"]
    report = child_failed(lines)
    assert report is not None
    assert (report.root_cause.exitcode, report.root_cause.signal) == (-9, "SIGKILL")
    assert report.other_failures == ()


def test_a_report_whose_top_was_cut_off_still_gives_its_root_cause() -> None:
    lines = log("torchrun-rank-raises")
    tail = lines[lines.index("Root Cause (first observed failure):") :]
    report = child_failed(tail)
    assert report is not None
    assert (report.name, report.root_cause.rank, report.other_failures) == ("", 1, ())


def test_a_report_cut_off_inside_the_root_cause_entry_is_no_report() -> None:
    lines = log("torchrun-rank-killed")
    root = lines.index("Root Cause (first observed failure):")
    assert lines[root + 5].startswith("  exitcode  :")
    assert child_failed(lines[: root + 5]) is None  # rank known, how it ended not


@pytest.mark.parametrize("name", ["dl-segv", "ppe-sigkill", "torchrun-agent-sighup", *HEALTHY])
def test_no_report_where_torchrun_printed_none(name: str) -> None:
    assert child_failed(log(name)) is None


# --- rank_tracebacks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["torchrun-rank-raises", "torchrun-rank-raises-tee", "torchrun-rank-raises-tee-template"],
)
def test_each_ranks_traceback_from_its_prefixed_lines_with_or_without_a_tee_prefix(name: str) -> None:
    ranks = rank_tracebacks(log(name))
    assert sorted(ranks) == [0, 1]
    assert ranks[1][:2] == ("ValueError", "bad batch shape (2, 3): expected (2, 4)")
    assert ranks[0].exc_type == "RuntimeError"
    assert "gloo" in ranks[0].message
    own = user_frame(ranks[0].frames)
    assert own is not None
    assert (own.function, own.file) == ("all_reduce_again", JOB)
    assert ranks[0].frames[0].function == "all_reduce"  # the library frame stays, innermost


def test_the_prefixes_keep_interleaved_ranks_apart() -> None:
    lines = [line for line in log("torchrun-rank-raises") if line.startswith("[rank")]
    zero, one = [x for x in lines if x.startswith("[rank0]")], [x for x in lines if x.startswith("[rank1]")]
    shuffled = [x for pair in zip(one, zero, strict=False) for x in pair] + zero[len(one) :]
    assert rank_tracebacks(shuffled) == rank_tracebacks(lines)


def test_a_rank_killed_by_a_signal_has_no_traceback() -> None:
    assert sorted(rank_tracebacks(log("torchrun-rank-killed"))) == [0]


@pytest.mark.parametrize("name", ["ppe-sigkill", "dl-segv", "gpu-nccl-watchdog", *HEALTHY])
def test_no_rank_tracebacks_without_rank_prefixed_tracebacks(name: str) -> None:
    assert rank_tracebacks(log(name)) == {}


# --- the agent's signals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "signal"), [("torchrun-agent-sighup", "SIGHUP"), ("torchrun-agent-sigterm", "SIGTERM")]
)
def test_the_agent_caught_a_signal_and_forwarded_it_to_both_ranks(name: str, signal: str) -> None:
    lines = log(name)
    caught = signal_exception(lines)
    assert caught is not None
    assert caught.signal == signal
    assert re.search(rf"^\w\d{{4}} [\d:.]+ {caught.pid} ", lines[0])  # the agent's own log lines name its pid


@pytest.mark.parametrize("name", ["torchrun-rank-raises", "ppe-sigkill", *HEALTHY])
def test_no_agent_signal_where_the_agent_caught_none(name: str) -> None:
    assert signal_exception(log(name)) is None


# --- DataLoader ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "signal", "shm"),
    [
        ("dl-sigkill", "SIGKILL", False),
        ("dl-segv", "SIGSEGV", False),
        ("dl-sigbus", "SIGBUS", True),
        ("dl-oom", "SIGKILL", False),
    ],
)
def test_the_signal_message_beats_the_chained_exited_unexpectedly(name: str, signal: str, shm: bool) -> None:
    lines = log(name)
    death = dataloader_death(lines)
    assert death is not None
    chained = next(line for line in lines if "exited unexpectedly" in line)
    stripped = [line.strip() for line in lines]
    assert lines.index(chained) > stripped.index(death.line)  # not the last message: the most specific
    assert (death.how, death.signal, death.shm_hint, death.exit_code) == (
        "killed-by-signal",
        signal,
        shm,
        None,
    )
    assert death.pids == (death.pid,)
    assert f"pid(s) {death.pid})" in chained


def test_a_worker_that_exited_with_a_code() -> None:
    death = dataloader_death(log("dl-exit-code"))
    assert death is not None
    assert (death.how, death.exit_code, death.signal) == ("exit-code", 3, None)


def test_without_the_signal_message_the_workers_own_report_names_the_signal() -> None:
    lines = [line for line in log("dl-segv") if "is killed by signal" not in line]
    death = dataloader_death(lines)
    assert death is not None
    assert (death.how, death.signal) == ("worker-fault", "SIGSEGV")
    assert death.pid is not None  # from the chained "pid(s) N exited unexpectedly"


def test_only_exited_unexpectedly_gives_the_pids_and_no_signal() -> None:
    lines = ["RuntimeError: DataLoader worker (pid(s) 811, 812) exited unexpectedly"]
    death = dataloader_death(lines)
    assert death is not None
    assert (death.how, death.pid, death.pids, death.signal) == ("exited-unexpectedly", 811, (811, 812), None)


@pytest.mark.parametrize("name", ["ppe-segv", "loky-segv", "torchrun-rank-raises", *HEALTHY])
def test_no_dataloader_death_without_a_dataloader_message(name: str) -> None:
    assert dataloader_death(log(name)) is None


# --- the GPU stack ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-nccl-watchdog", [("nccl-timeout", "ALLREDUCE", 1), ("nccl-timeout", "ALLREDUCE", 0)]),
        ("gpu-nccl-watchdog-old", [("nccl-timeout", "ALLREDUCE", 1), ("nccl-timeout", "ALLREDUCE", 3)]),
        ("gpu-nccl-abort", [("nccl-timeout", "ALLREDUCE", 3)]),
        (
            "gpu-device-assert",
            [("cuda-kernel-assert", "t >= 0 && t < n_classes", None)] * 2
            + [("cuda-device-assert", None, None)],
        ),
        ("gpu-device-assert-dsa", [("cuda-device-assert", None, None)]),
        ("gpu-cublas", [("cublas", "CUBLAS_STATUS_EXECUTION_FAILED", None)]),
        ("gpu-cublas-not-initialized", [("cublas", "CUBLAS_STATUS_NOT_INITIALIZED", None)]),
        ("gpu-illegal-memory-access", [("cuda-illegal-memory-access", None, None)]),
        ("gpu-ecc-cuda", [("gpu-ecc", None, None)]),
        ("gpu-nccl-duplicate-gpu", [("nccl-duplicate-gpu", None, None)]),
        ("rank-size-mismatch", [("gloo-size-mismatch", "8 vs 4", None)]),
    ],
)
def test_gpu_error_texts(name: str, expected: list[tuple[str, str | None, int | None]]) -> None:
    assert [(e.kind, e.code, e.rank) for e in gpu_errors(log(name))] == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "kmsg-xid-ecc",
            [("gpu-ecc", "48", None, "PCI:0000:07:00"), ("gpu-ecc", "64", None, "PCI:0000:07:00")],
        ),
        (
            "kmsg-xid",
            [("xid", "13", None, "PCI:0000:cb:00")] * 2 + [("xid", "109", 1797828, "PCI:0000:cb:00")],
        ),
        (
            "kmsg-xid-off-bus",
            [("gpu-off-bus", "79", None, "PCI:0000:44:00"), ("gpu-off-bus", None, None, None)],
        ),
        (
            "kmsg-xid-contained-ecc",
            [("xid", "45", 1818990, "PCI:0000:dc:00"), ("gpu-ecc", "94", 1234, "PCI:0000:9b:00")],
        ),
    ],
)
def test_xid_lines_of_the_kernel_log(
    name: str, expected: list[tuple[str, str | None, int | None, str | None]]
) -> None:
    assert [(e.kind, e.code, e.pid, e.device) for e in gpu_errors(log(name))] == expected


def test_each_gpu_error_keeps_its_line() -> None:
    lines = log("gpu-cublas")
    assert [e.line for e in gpu_errors(lines)] == [lines[0]]


@pytest.mark.parametrize("name", ["torchrun-rank-raises", "dl-sigbus", "loky-segv", *HEALTHY])
def test_no_gpu_errors_in_cpu_logs(name: str) -> None:
    assert gpu_errors(log(name)) == []


# --- tracebacks and the user's frame ------------------------------------------------------------------


def test_a_chained_traceback_ends_with_the_exception_that_ended_the_process() -> None:
    tb = parse_traceback(log("dl-segv"))
    assert tb is not None
    assert tb.exc_type == "RuntimeError"
    assert re.fullmatch(r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", tb.message)


def test_the_users_frame_skips_the_standard_library() -> None:
    tb = parse_traceback(log("ppe-sigkill"))
    assert tb is not None
    assert tb.frames[0].file.endswith("/concurrent/futures/_base.py")
    own = user_frame(tb.frames)
    assert own is not None
    assert (own.function, own.file) == ("<listcomp>", JOB)


@pytest.mark.parametrize(
    "frames",
    [
        (),
        (Frame("_run_code", "<frozen runpy>", 88),),
        (Frame("<module>", "/work/main/.venv/bin/torchrun", 8),),  # a console-script launcher
        (
            Frame(
                "all_reduce",
                "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py",
                1,
            ),
        ),
        (
            Frame("wait", "/usr/lib/python3.11/threading.py", 324),
            Frame("ncclCommWatchdog", "libtorch_cuda.so", native=True),
        ),
    ],
)
def test_no_users_frame_when_every_frame_is_a_librarys(frames: tuple[Frame, ...]) -> None:
    assert user_frame(frames) is None


def test_a_user_script_beside_the_launcher_is_the_users() -> None:
    frames = (Frame("main", "/home/me/bin/train.py", 12), Frame("<module>", "/home/me/venv/bin/torchrun", 8))
    assert user_frame(frames) == frames[0]


def test_no_traceback_in_a_healthy_log() -> None:
    assert all(parse_traceback(log(name)) is None for name in HEALTHY)


def test_the_public_surface() -> None:
    assert all(getattr(mltext, name) is not None for name in mltext.__all__)
