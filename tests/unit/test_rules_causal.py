"""The causal verdict across the tree (rules.causal): the process that failed first leads, the wrapper
exceptions of its parents and a launcher's teardown are evidence under it, never the root cause."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.model import Finding
from jobwarden.observations import (
    Frame,
    OomEvidence,
    ProcessDeath,
    ProcessStack,
    ThreadStack,
    UncaughtException,
)
from jobwarden.rules import RunEvidence, explain, mltext
from jobwarden.rules.causal import CAUSE, REPORT, TEARDOWN, WEAK, incidents, root_incident

from .test_rules import assert_well_formed

T = 1_700_000_000.0
MAIN, RANK0, RANK1 = 4000, 4001, 4002
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
TORCHRUN_TAIL = (
    "Traceback (most recent call last):",
    '  File "/v/bin/torchrun", line 8, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
)


def main_death(at: float, exit_code: int | None = 1, signal: str | None = None) -> ProcessDeath:
    return ProcessDeath(MAIN, 1, "torchrun --nproc_per_node 2 train.py", at, exit_code, signal, is_main=True)


def rank_death(pid: int, rank: int, at: float, exit_code: int | None, signal: str | None) -> ProcessDeath:
    return ProcessDeath(pid, MAIN, "python train.py", at, exit_code, signal, rank=rank)


def failed(**changes: Any) -> RunEvidence:
    base = RunEvidence(state="failed", exit_code=1, signal=None, end_reason="exited", pid=MAIN)
    return dataclasses.replace(base, **changes)


def only(findings: list[Finding], rule: str) -> Finding:
    (found,) = [f for f in findings if f.rule == rule]
    return found


def test_a_rank_killed_from_outside_leads_and_torchruns_teardown_and_report_are_collateral() -> None:
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(
            rank_death(RANK1, 1, T + 0.120, None, "SIGKILL"),
            rank_death(RANK0, 0, T + 0.180, None, "SIGTERM"),
            main_death(T + 0.400),
        ),
        exceptions=(UncaughtException(MAIN, T + 0.390, CHILD_FAILED, "train.py FAILED"),),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0], first.rank) == ("killed-externally", RANK1, 1)
    assert first.summary.startswith("Rank 1 (pid 4002) was killed by SIGKILL at ")
    assert any("rank 0 (pid 4001) was torn down by SIGTERM" in e for e in first.evidence)
    assert any("the main process (pid 4000) raised ChildFailedError" in e for e in first.evidence)
    assert "python-exception" not in [f.rule for f in findings]  # the wrapper is evidence, not a finding
    assert_well_formed(findings)


def test_the_rank_that_raised_first_is_the_root_cause_with_its_own_traceback() -> None:
    raised = UncaughtException(
        RANK1,
        T + 0.100,
        "ValueError",
        "loss is nan",
        (
            Frame("_check", "/v/lib/python3.11/site-packages/torch/utils/checks.py", 12),
            Frame("step", "/srv/train.py", 48),
            Frame("<module>", "/srv/train.py", 90),
        ),
        rank=1,
    )
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(
            rank_death(RANK1, 1, T + 0.101, 1, None),
            rank_death(RANK0, 0, T + 0.150, None, "SIGTERM"),
            main_death(T + 0.300),
        ),
        exceptions=(raised, UncaughtException(MAIN, T + 0.290, CHILD_FAILED, "")),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", RANK1, 1)
    assert "ValueError: loss is nan" in first.summary
    # the user's own frame, with the library frame that raised as context
    assert "raised at /srv/train.py:48 in step, inside torch/utils/checks.py:12 in _check" in first.evidence


def test_a_pool_worker_crash_leads_over_the_broken_process_pool_it_caused() -> None:
    worker = ProcessDeath(811, MAIN, "python etl.py", T + 1.0, None, "SIGSEGV")
    ev = failed(
        log_tail=(
            "Traceback (most recent call last):",
            '  File "/srv/etl.py", line 48, in main',
            "concurrent.futures.process.BrokenProcessPool: A process in the process pool was terminated "
            "abruptly while the future was running or pending.",
        ),
        deaths=(worker, main_death(T + 1.2)),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0]) == ("native-crash", 811)
    assert first.summary.startswith("ProcessPoolExecutor worker pid 811 was killed by SIGSEGV")
    assert any("raised BrokenProcessPool" in e for e in first.evidence)
    assert [f.rule for f in findings].count("python-exception") == 0


def test_the_main_processs_own_exception_leads_over_the_workers_it_then_terminated() -> None:
    # `with Pool() as pool:` unwinding an exception terminates (SIGTERM) the workers before the process exits
    ev = failed(
        log_tail=(
            "Traceback (most recent call last):",
            '  File "/srv/a.py", line 3, in <module>',
            "KeyError: 3",
        ),
        deaths=(
            ProcessDeath(811, MAIN, "python a.py", T + 0.01, None, "SIGTERM"),
            ProcessDeath(812, MAIN, "python a.py", T + 0.01, None, "SIGTERM"),
            main_death(T + 0.05),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids) == ("python-exception", (MAIN,))


def test_without_the_childs_death_the_first_teardown_stands_in_for_it() -> None:
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(rank_death(RANK0, 0, T + 0.2, None, "SIGTERM"), main_death(T + 0.4)),
    )
    assert [i.weight for i in incidents(ev)] == [TEARDOWN, REPORT]
    root = root_incident(ev)
    assert root is not None and root.death.pid == RANK0


def test_deaths_after_jobwarden_began_to_stop_the_run_are_not_causes() -> None:
    ev = failed(
        state="stopped",
        end_reason="stopped",
        signal="SIGTERM",
        exit_code=None,
        stopping_at=T + 1.0,
        deaths=(
            ProcessDeath(811, MAIN, "python a.py", T + 1.1, None, "SIGKILL"),
            main_death(T + 1.2, None, "SIGTERM"),
        ),
    )
    assert incidents(ev) == []
    assert explain(ev)[0].rule == "stopped-by-user"


def test_the_main_process_killed_first_leads_and_its_orphans_follow() -> None:
    # the torchrun agent SIGKILLed: its ranks are left to jobwarden, which ends them after the main process
    ev = failed(
        signal="SIGKILL",
        exit_code=None,
        end_reason="signalled",
        orphans_left=[{"pid": RANK0, "cmdline": "python train.py"}],
        deaths=(main_death(T, None, "SIGKILL"), rank_death(RANK0, 0, T + 0.5, None, "SIGTERM")),
    )
    rules = [f.rule for f in explain(ev)]
    assert rules == ["killed-externally", "orphans-left"]
    assert [i.weight for i in incidents(ev)] == [CAUSE]


def test_at_the_same_moment_a_death_by_signal_comes_before_an_exit() -> None:
    # collected in one tick: rank 0's gloo error exit and rank 1's SIGKILL carry the same moment
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(
            rank_death(RANK0, 0, T, 1, None),
            rank_death(RANK1, 1, T, None, "SIGKILL"),
            main_death(T + 0.2),
        ),
    )
    assert explain(ev)[0].pids[0] == RANK1


def test_a_kill_that_came_after_a_worker_had_failed_did_not_cause_it() -> None:
    # Ray's shutdown: a worker exits 3 with no traceback, the driver raises about it, and 0.9 s later the
    # raylet SIGKILLs an idle worker: both deaths stamped by the kernel, the kill plainly after the exit
    worker, idle = 171, 98
    ev = failed(
        deaths=(
            ProcessDeath(worker, 60, "ray::IDLE", T, 3, None),
            ProcessDeath(idle, 60, "ray::IDLE", T + 0.93, None, "SIGKILL"),
            main_death(T + 1.5),
        ),
    )
    assert (root_incident(ev).pid, root_incident(ev).weight) == (worker, WEAK)  # type: ignore[union-attr]
    assert explain(ev)[0].pids[0] == worker
    # within the deaths' own clock a kill a moment before the exit still leads: it may have caused it
    close = dataclasses.replace(
        ev, deaths=(*ev.deaths[:1], dataclasses.replace(ev.deaths[1], at=T + 0.05), ev.deaths[2])
    )
    assert root_incident(close).pid == idle  # type: ignore[union-attr]


def test_nothing_is_rearranged_while_the_run_is_alive_or_after_it_succeeded() -> None:
    worker = ProcessDeath(811, MAIN, "python a.py", T, None, "SIGKILL")
    assert explain(failed(state="running", exit_code=None, end_reason=None, deaths=(worker,))) == []
    ok = failed(state="succeeded", exit_code=0, deaths=(worker, main_death(T + 1, 0)))
    assert explain(ok) == []


def test_a_launcher_turning_sighup_into_an_exception_is_a_terminal_hangup() -> None:
    # torchrun re-arms SIGHUP (even under nohup) and raises SignalException when it arrives
    ev = failed(
        log_tail=(
            "Traceback (most recent call last):",
            '  File "/v/bin/torchrun", line 8, in <module>',
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4000 got signal: 1",
        ),
        deaths=(main_death(T),),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids) == ("terminal-hangup", (MAIN,))


# --- on what the real libraries printed (tests/fixtures/mlstack) ------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mlstack"


def recorded(name: str) -> tuple[str, ...]:
    return tuple((FIXTURES / f"{name}.log").read_text().splitlines())


def test_torchrun_rank_that_raised_is_named_from_its_rank_lines() -> None:
    # the hooks' record is gone: init_process_group replaces sys.excepthook with its `[rankN]:` printer
    ev = failed(
        log_tail=recorded("torchrun-rank-raises"),
        deaths=(
            rank_death(RANK1, 1, T + 0.10, 1, None),
            rank_death(RANK0, 0, T + 0.15, None, "SIGTERM"),
            main_death(T + 0.40),
        ),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", RANK1, 1)
    assert first.title == "Rank 1 (pid 4002): uncaught ValueError"
    assert any("mlstack.py" in e and e.startswith("raised at") for e in first.evidence)
    assert all("ChildFailedError" not in f.title for f in findings)


def test_torchruns_report_names_the_rank_when_no_death_of_it_was_seen() -> None:
    # --no-py-hooks and no kernel events: only the main process's end is known, and torchrun's report
    ev = failed(log_tail=recorded("torchrun-rank-killed"), deaths=(main_death(T + 0.40),))
    first = explain(ev)[0]
    assert (first.rule, first.rank) == ("killed-externally", 1)
    assert "SIGKILL" in first.summary
    assert any("torn down by SIGTERM" in e for e in first.evidence)  # rank 0, per the report


@pytest.mark.parametrize(
    ("log", "signal", "rule"),
    [("ppe-segv", "SIGSEGV", "native-crash"), ("loky-sigkill", "SIGKILL", "killed-externally")],
)
def test_a_pool_workers_death_leads_over_the_pools_wrapper(log: str, signal: str, rule: str) -> None:
    worker = ProcessDeath(811, MAIN, "python mlstack.py", T + 0.05, None, signal)
    ev = failed(log_tail=recorded(log), deaths=(worker, main_death(T + 0.20)))
    findings = explain(ev)
    assert (findings[0].rule, findings[0].pids[0]) == (rule, 811)
    assert "python-exception" not in [f.rule for f in findings]


@pytest.mark.parametrize(
    ("log", "signal"),
    [("dl-segv", "SIGSEGV"), ("dl-sigkill", "SIGKILL"), ("dl-sigbus", "SIGBUS")],
)
def test_the_dataloaders_most_specific_message_wins(log: str, signal: str) -> None:
    lines = recorded(log)
    worker = int(
        next(line for line in lines if "is killed by signal" in line).split("(pid ")[1].split(")")[0]
    )
    ev = failed(
        log_tail=lines,
        deaths=(ProcessDeath(worker, MAIN, "python", T, None, signal), main_death(T + 0.2)),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("dataloader-worker-killed", worker)
    assert signal in first.title
    if signal == "SIGBUS":
        assert all(s in first.remedy for s in ("--shm-size", "--ipc=host", "num_workers", "file_system"))


@pytest.mark.parametrize(
    ("log", "remedy"),
    [
        ("gpu-device-assert", "number of classes"),  # the kernel's own assertion, printed before
        ("gpu-device-assert-dsa", "CUDA_LAUNCH_BLOCKING=1"),
        ("gpu-cublas", "cuBLAS"),
        ("gpu-illegal-memory-access", "compute-sanitizer"),
        ("gpu-ecc-cuda", "hardware fault"),
        ("gpu-nccl-duplicate-gpu", "torch.cuda.set_device"),
    ],
)
def test_the_gpu_stacks_own_text_sharpens_the_finding(log: str, remedy: str) -> None:
    lines = recorded(log)
    ev = failed(log_tail=lines, deaths=(main_death(T),), signal=None, exit_code=1)
    first = explain(ev)[0]
    assert any(e.startswith("GPU stack (") for e in first.evidence), first
    assert remedy in first.remedy


def test_nccls_watchdog_timeout_is_a_collective_hang() -> None:
    ev = failed(
        log_tail=recorded("gpu-nccl-watchdog"), deaths=(main_death(T, None, "SIGABRT"),), signal="SIGABRT"
    )
    assert explain(ev)[0].rule == "collective-hang"


def test_the_workers_last_stack_tells_what_it_was_doing() -> None:
    stack = ProcessStack(
        811,
        "py-spy",
        (
            ThreadStack(
                811,
                "MainThread",
                (
                    Frame("dumps", "/usr/lib/python3.11/multiprocessing/reduction.py", 51),
                    Frame("_sendback_result", "/usr/lib/python3.11/concurrent/futures/process.py", 211),
                    Frame("transform", "/srv/etl.py", 12),
                ),
            ),
        ),
    )
    worker = ProcessDeath(811, MAIN, "python etl.py", T + 1.0, None, "SIGSEGV")
    ev = failed(deaths=(worker, main_death(T + 1.2)), last_stacks={811: stack})
    first = explain(ev)[0]
    assert any(
        e.startswith("its last stack (thread 'MainThread'") and "_sendback_result" in e
        for e in first.evidence
    )


def test_torchruns_agent_ended_by_sighup_is_a_terminal_hangup_on_the_real_output() -> None:
    # torchrun handles SIGHUP itself (even under nohup), forwards it to the ranks and exits 1
    ev = failed(
        log_tail=recorded("torchrun-agent-sighup"),
        deaths=(
            rank_death(RANK0, 0, T + 0.01, None, "SIGHUP"),
            rank_death(RANK1, 1, T + 0.01, None, "SIGHUP"),
            main_death(T + 0.2),
        ),
    )
    findings = explain(ev)
    assert (findings[0].rule, findings[0].pids) == ("terminal-hangup", (MAIN,))


def test_a_childs_bare_exit_code_that_its_shell_handled_is_not_the_root_cause() -> None:
    # pyenv's `python3` shim is a bash script: `readlink` in it exits 1 and the script goes on, then
    # python raises; the ValueError is the root cause, not the readlink
    ev = failed(
        log_tail=(
            "Traceback (most recent call last):",
            '  File "/srv/train.py", line 3, in <module>',
            "ValueError: bad learning rate",
        ),
        deaths=(
            ProcessDeath(812, MAIN, "/usr/bin/readlink conda.bash", T + 0.01, 1, None),
            main_death(T + 0.5),
        ),
        exceptions=(UncaughtException(MAIN, T + 0.49, "ValueError", "bad learning rate"),),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids) == ("python-exception", (MAIN,))


def test_a_childs_bare_exit_still_leads_when_the_main_process_only_reported_it() -> None:
    # a rank that called sys.exit(1): no exception of its own, torchrun's ChildFailedError reports it
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(rank_death(RANK1, 1, T + 0.1, 1, None), main_death(T + 0.4)),
        exceptions=(UncaughtException(MAIN, T + 0.39, CHILD_FAILED, "train.py FAILED"),),
    )
    first = explain(ev)[0]
    assert (first.pids[0], first.rank) == (RANK1, 1)


def test_a_rank_that_raised_and_then_aborted_in_its_teardown_is_named_by_its_exception() -> None:
    # seen with torch 2.13 and gloo: the rank's ValueError, then SIGABRT from a destructor at shutdown
    raised = UncaughtException(RANK1, T + 0.100, "ValueError", "bad batch shape", (), rank=1)
    ev = failed(
        log_tail=TORCHRUN_TAIL,
        deaths=(
            rank_death(RANK1, 1, T + 0.120, None, "SIGABRT"),
            rank_death(RANK0, 0, T + 0.150, None, "SIGTERM"),
            main_death(T + 0.300),
        ),
        exceptions=(raised, UncaughtException(MAIN, T + 0.290, CHILD_FAILED, "")),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", RANK1, 1)
    assert "then it aborted (SIGABRT) while shutting down" in first.evidence


def test_an_abort_without_a_recorded_exception_is_still_a_native_crash() -> None:
    ev = failed(deaths=(rank_death(RANK1, 1, T + 0.1, None, "SIGABRT"), main_death(T + 0.3)))
    assert explain(ev)[0].rule == "native-crash"


# --- stacks nobody tuned the verdict for: what the libraries printed, with the hooks' records ---------


def printed_message(lines: tuple[str, ...], exception_line: str) -> str:
    """A printed exception's whole message (what the hooks record): its line and those that follow."""
    start = next(i for i, line in enumerate(lines) if line.startswith(exception_line))
    return "\n".join([lines[start].partition(": ")[2], *lines[start + 1 :]])


WORKER, SIBLING = 811, 812


def caught(
    pid: int, at: float, kind: str, message: str, *frames: Frame, rank: int | None = None
) -> UncaughtException:
    return UncaughtException(pid, at, kind, message, frames, rank=rank)


def test_a_spawned_process_that_raised_is_named_over_the_main_processs_reraise() -> None:
    lines = recorded("corpus-spawn-raises")
    raised_at = Frame("_spawned", "/work/wt-rootcause/tests/integration/jobs/corpus.py", 91)
    ev = failed(
        log_tail=lines,
        deaths=(
            ProcessDeath(WORKER, MAIN, "python -c from multiprocessing.spawn", T + 0.05, 1, None),
            ProcessDeath(SIBLING, MAIN, "python -c from multiprocessing.spawn", T + 0.06, None, "SIGTERM"),
            main_death(T + 0.5),
        ),
        exceptions=(
            UncaughtException(
                MAIN,
                T + 0.4,
                "torch.multiprocessing.spawn.ProcessRaisedException",
                printed_message(lines, "torch.multiprocessing.spawn.ProcessRaisedException"),
                (
                    Frame(
                        "ProcessContext.join",
                        "/v/lib/python3.11/site-packages/torch/multiprocessing/spawn.py",
                        211,
                    ),
                ),
            ),
        ),
        caught=(
            caught(WORKER, T + 0.01, "ValueError", "bad batch shape (2, 3): expected (2, 4)", raised_at),
        ),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", WORKER, 1)
    assert first.title == "Rank 1 (pid 811): uncaught ValueError"
    assert any(
        e.startswith("raised at /work/wt-rootcause/tests/integration/jobs/corpus.py:91")
        for e in first.evidence
    )
    assert any("re-raised" in e and f"pid {MAIN}" in e for e in first.evidence)
    assert [f.rule for f in findings].count("python-exception") == 1  # the re-raise is evidence, folded in
    assert_well_formed(findings)


def test_a_spawned_process_torn_down_while_it_exited_of_its_exception_is_still_the_cause() -> None:
    # The race seen in CI under load: process 1 formats its ValueError and exits 1, closing its gloo
    # connection while it finalizes; process 0 fails on the closed connection and exits first, so the
    # parent re-raises process 0's error and SIGTERMs process 1, which the parent's report never names.
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29641"
    lines = (
        "Traceback (most recent call last):",
        '  File "/srv/corpus.py", line 102, in run_spawn',
        "torch.multiprocessing.spawn.ProcessRaisedException: ",
        "",
        "-- Process 0 terminated with the following error:",
        "Traceback (most recent call last):",
        '  File "/srv/corpus.py", line 95, in _spawned',
        f"RuntimeError: {gloo}",
    )
    raised_at = Frame("_spawned", "/srv/corpus.py", 91)
    ev = failed(
        log_tail=lines,
        deaths=(
            ProcessDeath(SIBLING, MAIN, "python -c from multiprocessing.spawn", T + 0.60, 1, None),
            ProcessDeath(WORKER, MAIN, "python -c from multiprocessing.spawn", T + 0.70, None, "SIGTERM"),
            main_death(T + 0.9),
        ),
        exceptions=(
            UncaughtException(
                MAIN,
                T + 0.8,
                "torch.multiprocessing.spawn.ProcessRaisedException",
                printed_message(lines, "torch.multiprocessing.spawn.ProcessRaisedException"),
            ),
        ),
        caught=(
            caught(
                WORKER, T + 0.01, "ValueError", "bad batch shape (2, 3): expected (2, 4)", raised_at, rank=1
            ),
            caught(SIBLING, T + 0.50, "RuntimeError", gloo, Frame("_spawned", "/srv/corpus.py", 95), rank=0),
        ),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", WORKER, 1), findings
    assert "killed-externally" not in [f.rule for f in findings]
    assert_well_formed(findings)
    # a process that formatted an exception long before a launcher tore it down was not dying of it
    earlier = dataclasses.replace(ev, caught=(dataclasses.replace(ev.caught[0], at=T - 5.0), ev.caught[1]))
    assert "ValueError" not in explain(earlier)[0].summary


def test_a_spawned_process_that_exited_3_leads_over_the_report_of_its_exit() -> None:
    lines = recorded("corpus-spawn-exits")
    ev = failed(
        log_tail=lines,
        deaths=(
            ProcessDeath(WORKER, MAIN, "python -c from multiprocessing.spawn", T + 0.05, 3, None),
            ProcessDeath(SIBLING, MAIN, "python -c from multiprocessing.spawn", T + 0.06, None, "SIGTERM"),
            main_death(T + 0.5),
        ),
        exceptions=(
            UncaughtException(
                MAIN,
                T + 0.4,
                "torch.multiprocessing.spawn.ProcessExitedException",
                "process 1 terminated with exit code 3",
            ),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("exit-code", WORKER, 1)
    assert first.title == "Rank 1 (pid 811): exited with code 3"
    assert any("raised ProcessExitedException reporting it" in e for e in first.evidence)


def test_ranks_started_by_a_shell_script_the_one_that_exited_first_leads_over_its_peers_gloo_error() -> None:
    ev = failed(
        log_tail=recorded("corpus-gloo-ranks"),  # no hooks' record: torch's excepthook printed [rank0]:
        deaths=(
            rank_death(RANK1, 1, T + 0.1, 3, None),
            rank_death(RANK0, 0, T + 0.9, 1, None),
            ProcessDeath(MAIN, 1, "bash ranks.sh", T + 0.91, 1, None, is_main=True),
        ),
    )
    findings = explain(ev)
    first = findings[0]
    assert (first.rule, first.pids[0], first.rank) == ("exit-code", RANK1, 1)
    assert "Rank 1 (pid 4002) exited with code 3" in first.summary
    reaction = next(e for e in first.evidence if "rank 0 (pid 4001)" in e)
    assert "failed in turn: RuntimeError, a peer's communication error" in reaction
    assert all(f.pids[:1] != (RANK0,) for f in findings)  # the reaction is no finding of its own


def test_lightning_ddp_rank_1_is_named_with_its_rank() -> None:
    # Lightning starts rank 1 with LOCAL_RANK=1 (its rank); rank 0 is the main process itself
    lines = recorded("corpus-lightning-raises")
    ev = failed(
        log_tail=lines,
        deaths=(
            ProcessDeath(WORKER, MAIN, "python corpus.py lightning-raises", T + 0.1, 1, None, rank=1),
            main_death(T + 0.6),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", WORKER, 1)
    assert first.title == "Rank 1 (pid 811): uncaught RuntimeError"
    main = next(i for i in incidents(ev) if i.is_main)
    assert (main.weight, main.rank) == (REPORT, 0)  # the [rank0]: traceback is the main process's


def test_a_rank_that_raised_and_took_long_to_die_is_still_the_cause() -> None:
    # seen with Lightning: rank 1's excepthook ran at once, its interpreter ended 5 s later, after the main
    # process (rank 0) had raised its gloo error: the end of the story is the main process's exception
    ev = failed(
        deaths=(
            ProcessDeath(WORKER, MAIN, "python corpus.py lightning-raises", T + 5.4, 1, None, rank=1),
            main_death(T + 6.9),
        ),
        exceptions=(
            UncaughtException(WORKER, T, "RuntimeError", "loss is nan at step 2", rank=1),
            UncaughtException(MAIN, T + 1.5, "RuntimeError", "Connection closed by peer [127.0.0.1]:24716"),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", WORKER, 1)
    assert "exit code 1" in first.evidence  # how it ended, though after the main process raised


def test_a_dataloader_workers_exception_is_the_workers_at_its_own_line() -> None:
    lines = recorded("corpus-dl-raises")
    inner = Frame("RaisingDataset.__getitem__", "/work/wt-rootcause/tests/integration/jobs/corpus.py", 116)
    reraise = UncaughtException(
        MAIN,
        T + 0.3,
        "ValueError",
        printed_message(lines, "ValueError: Caught ValueError"),
        (Frame("ExceptionWrapper.reraise", "/v/lib/python3.11/site-packages/torch/_utils.py", 794),),
    )
    ev = failed(
        log_tail=lines,
        deaths=(main_death(T + 0.5),),
        exceptions=(reraise,),
        caught=(caught(WORKER, T + 0.1, "ValueError", "corrupt record 9: expected 4 fields, got 3", inner),),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("python-exception", WORKER)
    assert any("corpus.py:116 in RaisingDataset.__getitem__" in e for e in first.evidence)
    # without the hooks' record of the worker: still its exception, about the process that re-raised it
    blind = explain(dataclasses.replace(ev, caught=()))[0]
    assert (blind.rule, blind.pids[0]) == ("python-exception", MAIN)
    assert blind.summary.startswith("A DataLoader worker raised ValueError")
    assert any("__getitem__" in e for e in blind.evidence)


@pytest.mark.parametrize("log", ["corpus-ppe-raises", "corpus-joblib-raises", "corpus-pool-raises"])
def test_an_executors_task_exception_is_the_workers(log: str) -> None:
    lines = recorded(log)
    start = next(i for i, line in enumerate(lines) if line.endswith("RemoteTraceback: "))
    remote = "\n".join(lines[start + 1 : lines.index('"""', start + 2) + 1])
    task = next(f for f in mltext.parse_traceback(lines[: lines.index('"""', start + 2)]).frames)
    ev = failed(
        log_tail=lines,
        deaths=(
            ProcessDeath(SIBLING, MAIN, "python corpus.py", T + 0.2, None, "SIGKILL"),  # loky's own cleanup
            main_death(T + 0.5),
        ),
        exceptions=(
            UncaughtException(
                MAIN,
                T + 0.4,
                "KeyError",
                "\"no feature named 'age_2' in the input row\"",
                chain=(("concurrent.futures.process._RemoteTraceback", remote),),
            ),
        ),
        caught=(caught(WORKER, T + 0.1, "KeyError", "\"no feature named 'age_2' in the input row\"", task),),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("python-exception", WORKER), first
    assert any(e.startswith("raised at ") and " in task" in e for e in first.evidence)


def test_a_subprocess_chain_names_the_grandchild_under_two_reports() -> None:
    child, grandchild = 4001, 4002
    report = "Command '['python', 'corpus.py', 'chain-grandchild']' returned non-zero exit status 1."
    ev = failed(
        log_tail=recorded("corpus-subprocess-chain"),
        deaths=(
            ProcessDeath(grandchild, child, "python corpus.py chain-grandchild", T + 0.1, 1, None),
            ProcessDeath(child, MAIN, "python corpus.py chain-child", T + 0.2, 1, None),
            main_death(T + 0.3),
        ),
        exceptions=(
            UncaughtException(grandchild, T + 0.09, "FileNotFoundError", "[Errno 2] No such file"),
            UncaughtException(child, T + 0.19, "subprocess.CalledProcessError", report),
            UncaughtException(MAIN, T + 0.29, "subprocess.CalledProcessError", report.replace("grand", "")),
        ),
    )
    timeline = incidents(ev)
    assert [i.weight for i in timeline] == [CAUSE, REPORT, REPORT]
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("python-exception", grandchild)


def test_a_pipelines_reader_fails_and_its_writers_broken_pipe_is_a_reaction() -> None:
    consumer, producer = 4001, 4002
    ev = failed(
        log_tail=recorded("corpus-pipeline"),
        deaths=(
            ProcessDeath(producer, MAIN, "python corpus.py produce", T + 0.02, 1, None),
            ProcessDeath(consumer, MAIN, "python corpus.py consume", T + 0.01, 1, None),
            ProcessDeath(MAIN, 1, "bash pipeline.sh", T + 0.03, 1, None, is_main=True),
        ),
        exceptions=(
            UncaughtException(producer, T + 0.015, "BrokenPipeError", "[Errno 32] Broken pipe"),
            UncaughtException(consumer, T + 0.005, "ValueError", "unparsable row 'row 500'"),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("python-exception", consumer)
    assert any("pid 4002 failed in turn: BrokenPipeError" in e for e in first.evidence)


def test_a_writer_killed_by_sigpipe_after_its_reader_failed_is_a_reaction() -> None:
    ev = failed(
        deaths=(
            ProcessDeath(4002, MAIN, "yes", T + 0.02, None, "SIGPIPE"),
            ProcessDeath(4001, MAIN, "head -c 1x", T + 0.01, 1, None),
            ProcessDeath(MAIN, 1, "bash -c yes | head", T + 0.03, 1, None, is_main=True),
        ),
    )
    assert [i.pid for i in incidents(ev) if i.weight == REPORT] == [4002]
    assert explain(ev)[0].pids[0] == 4001


def test_a_helper_whose_exit_code_its_parent_took_as_an_answer_is_not_the_cause() -> None:
    # `grep` found nothing (exit 1); the script ran on for a minute, then failed on its own
    ev = failed(
        deaths=(
            ProcessDeath(4001, MAIN, "grep -q x f", T, 1, None),
            ProcessDeath(MAIN, 1, "bash job.sh", T + 60, 2, None, is_main=True),
        ),
    )
    assert [i.weight for i in incidents(ev)] == [TEARDOWN, WEAK]
    assert explain(ev)[0].pids == (MAIN,)


def test_a_report_mentions_no_none_and_nothing_is_torn_down_by_nothing() -> None:
    # the local Ray job: a worker exits 3 (no traceback); its parent's teardown and the driver's report
    ev = failed(
        log_tail=(
            "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task.",
        ),
        deaths=(
            ProcessDeath(4001, 4000, "ray::dies", T, 3, None),
            ProcessDeath(4003, MAIN, "ray::IDLE", T + 0.01, 1, None),
            main_death(T + 0.3),
        ),
        exceptions=(
            UncaughtException(
                MAIN,
                T + 0.25,
                "ray.exceptions.WorkerCrashedError",
                "The worker died unexpectedly while executing",
            ),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0]) == ("exit-code", 4001)
    text = " ".join((first.summary, *first.evidence))
    assert "None" not in text
    assert "raised WorkerCrashedError reporting it" in text


# --- properties of the ordering: arrival, ties and clock skew never lift a report above its cause ------

CAUSES = st.sampled_from(["SIGKILL", "SIGSEGV", "exit", "exception", "relayed"])
REPORTS = st.sampled_from(["wrapper", "words", "peer", "called-process", "sigpipe", "bare-parent"])


@st.composite
def cascades(draw: st.DrawFn) -> tuple[RunEvidence, int]:
    """A cause in one process, then reports and reactions of others, teardowns of the rest: deaths at
    their true moments (the kernel's), exceptions at moments shifted by one skew (the hooks' clock), the
    whole in any arrival order, moments rounded so that many tie."""
    grid = draw(st.sampled_from([0.001, 0.05, 0.2]))
    skew = draw(st.floats(min_value=-0.5, max_value=0.5))
    cause_kind = draw(CAUSES)
    culprit = 5000
    t0 = T + 1.0
    deaths: list[ProcessDeath] = []
    exceptions: list[UncaughtException] = []
    caught_list: list[UncaughtException] = []
    reporter_of_relay = None

    def when(true: float, hooks: bool = False) -> float:
        return round(((true + skew) if hooks else true) / grid) * grid

    if cause_kind in ("SIGKILL", "SIGSEGV"):
        deaths.append(ProcessDeath(culprit, MAIN, "python w.py", when(t0), None, cause_kind))
    elif cause_kind == "exit":
        deaths.append(ProcessDeath(culprit, MAIN, "python w.py", when(t0), 3, None))
    elif cause_kind == "exception":
        exceptions.append(UncaughtException(culprit, when(t0 - 0.001, True), "ValueError", "bad value"))
        deaths.append(ProcessDeath(culprit, MAIN, "python w.py", when(t0), 1, None))
    else:  # a worker formatted its exception; its parent re-raises it (DataLoader, a pool)
        frame = Frame("load", "/srv/data.py", 12)
        caught_list.append(UncaughtException(culprit, when(t0, True), "ValueError", "bad record 9", (frame,)))
        reporter_of_relay = 6000
    n = draw(st.integers(min_value=1, max_value=4))
    for k, kind in enumerate(draw(st.lists(REPORTS, min_size=n, max_size=n))):
        pid, later = 6000 + k, t0 + draw(st.floats(min_value=0.0, max_value=3.0))
        if pid == reporter_of_relay:
            relay_text = (
                "Caught ValueError in a worker process 0.\nOriginal Traceback (most recent call last):\n"
                '  File "/srv/data.py", line 12, in load\nValueError: bad record 9'
            )
            exceptions.append(UncaughtException(pid, when(later, True), "ValueError", relay_text))
            deaths.append(ProcessDeath(pid, MAIN, "python r.py", when(later + 0.01), 1, None))
        elif kind == "sigpipe":
            deaths.append(ProcessDeath(pid, MAIN, "yes", when(later), None, "SIGPIPE"))
        elif kind == "bare-parent":
            continue  # the main process's own bare exit below plays this part
        else:
            kind_name, text = {
                "wrapper": (
                    "concurrent.futures.process.BrokenProcessPool",
                    "A child process terminated abruptly",
                ),
                "words": ("RuntimeError", "a worker died unexpectedly"),
                "peer": ("RuntimeError", "Connection closed by peer [127.0.0.1]:1243"),
                "called-process": ("subprocess.CalledProcessError", "returned non-zero exit status 1."),
            }[kind]
            exceptions.append(UncaughtException(pid, when(later, True), kind_name, text))
            deaths.append(ProcessDeath(pid, MAIN, "python r.py", when(later + 0.01), 1, None))
    for k in range(draw(st.integers(min_value=0, max_value=2))):  # a launcher's teardown of the others
        deaths.append(ProcessDeath(7000 + k, MAIN, "python r.py", when(t0 + 0.05 * (k + 1)), None, "SIGTERM"))
    deaths.append(ProcessDeath(MAIN, 1, "launcher", when(t0 + 3.5), 1, None, is_main=True))
    order = draw(st.permutations(range(len(deaths))))
    ev = failed(
        deaths=tuple(deaths[i] for i in order),
        exceptions=tuple(draw(st.permutations(exceptions))),
        caught=tuple(caught_list),
    )
    return ev, culprit


@given(cascades())
def test_no_report_or_reaction_ever_leads_over_its_cause(case: tuple[RunEvidence, int]) -> None:
    ev, culprit = case
    root = root_incident(ev)
    assert root is not None and root.pid == culprit, incidents(ev)
    first = explain(ev)[0]
    assert first.pids[0] == culprit, first
    assert all(i.weight == REPORT for i in incidents(ev) if i.why and "reporting" in i.why)


@given(cascades(), st.randoms(use_true_random=False))
def test_the_verdict_does_not_depend_on_the_order_the_evidence_arrived_in(
    case: tuple[RunEvidence, int], rnd: Any
) -> None:
    ev, _ = case
    deaths, exceptions = list(ev.deaths), list(ev.exceptions)
    rnd.shuffle(deaths)
    rnd.shuffle(exceptions)
    again = dataclasses.replace(ev, deaths=tuple(deaths), exceptions=tuple(exceptions))
    assert [i.pid for i in incidents(again)] == [i.pid for i in incidents(ev)]
    assert explain(again) == explain(ev)


def test_a_helper_commands_exit_before_a_stop_is_never_the_root_cause() -> None:
    """pyenv's `python3` runs `readlink`, which exits 1, in the job's first moments; the job is stopped by
    its engine 0.1 s later: the stop ended the run, not readlink (its parent took the answer and went on)."""
    shell = ProcessDeath(4100, MAIN, "bash /root/.pyenv/libexec/pyenv-hooks which", T + 0.02, 0, None)
    readlink = ProcessDeath(4101, 4100, "/usr/bin/readlink conda.bash", T + 0.01, 1, None)
    ev = failed(
        state="stopped",
        exit_code=143,
        end_reason="engine-stop",
        stopping_at=T + 0.1,
        deaths=(readlink, shell, main_death(T + 0.15, exit_code=143)),
    )
    assert root_incident(ev) is None
    assert "exit-code" not in [f.rule for f in explain(ev)][:1]
    # the same exit with nothing after it but a failing parent: still the first failure
    parent_failed = dataclasses.replace(
        ev, deaths=(readlink, dataclasses.replace(shell, exit_code=2), main_death(T + 0.15))
    )
    assert root_incident(parent_failed) is not None


def test_a_helper_commands_exit_before_an_oom_kill_is_never_the_root_cause() -> None:
    """Under Slurm's --mem, pyenv's `python3` runs `readlink` (exit 1) and then execs python, which the
    cgroup's OOM killer takes 0.17 s later: the memory ended the run (seen in CI: `exit-code` led)."""
    subshell = ProcessDeath(4100, MAIN, "bash /root/.pyenv/libexec/pyenv-exec python3", T + 0.02, 0, None)
    readlink = ProcessDeath(4101, 4100, "/usr/bin/readlink conda.bash", T + 0.01, 1, None)
    oom = OomEvidence("cgroup-v1", 1, victims=(MAIN,))
    ev = failed(
        exit_code=None,
        signal="SIGKILL",
        oom=oom,
        deaths=(readlink, subshell, main_death(T + 0.18, exit_code=None, signal="SIGKILL")),
    )
    root = root_incident(ev)
    assert root is not None and root.pid == MAIN
    assert explain(ev)[0].rule == "oom-kill"
    # two helpers, 4 ms apart (pyenv's readlink, then another of its commands)
    second = ProcessDeath(4102, 4100, "bash /root/.pyenv/libexec/pyenv-version-name", T + 0.014, 1, None)
    both = dataclasses.replace(ev, deaths=(*ev.deaths, second))
    assert explain(both)[0].rule == "oom-kill"
    # a helper whose parent failed of it before the OOM kill still leads
    parent_failed = dataclasses.replace(
        ev, deaths=(readlink, dataclasses.replace(subshell, exit_code=2), *ev.deaths[2:])
    )
    root = root_incident(parent_failed)
    assert root is not None and root.pid != MAIN


# --- a helper's early exit that changed nothing ---------------------------------------------------------

HELPER = 4005
ACCELERATE_TAIL = (
    "Traceback (most recent call last):",
    '  File "/v/bin/accelerate", line 8, in <module>',
    "subprocess.CalledProcessError: Command '['/v/bin/python', 'train.py']' returned non-zero exit status 1.",
)


def accelerate_failure(helper_at: float) -> RunEvidence:
    """`accelerate launch` of two ranks: a helper of the launch exits 255 at T (no traceback), the job
    goes on, rank 1 raises at T + 2, rank 0 is torn down, the launcher reports the failed rank."""
    raised = UncaughtException(
        RANK1, T + 2.0, "ValueError", "loss is nan", (Frame("step", "/srv/train.py", 48),), rank=1
    )
    return failed(
        log_tail=ACCELERATE_TAIL,
        deaths=(
            ProcessDeath(
                HELPER, MAIN, "/v/bin/python -c import torch; torch.cuda.device_count()", helper_at, 255, None
            ),
            rank_death(RANK1, 1, T + 2.05, 1, None),
            rank_death(RANK0, 0, T + 2.3, None, "SIGTERM"),
            ProcessDeath(
                MAIN, 1, "/v/bin/python /v/bin/accelerate launch train.py", T + 2.6, 1, None, is_main=True
            ),
        ),
        exceptions=(
            raised,
            UncaughtException(
                MAIN, T + 2.5, "subprocess.CalledProcessError", ACCELERATE_TAIL[-1].partition(": ")[2]
            ),
        ),
    )


def test_a_helpers_early_exit_that_changed_nothing_does_not_outrank_the_failure_all_reacted_to() -> None:
    # the CI case: the helper's exit 255 was named the root cause, "first in the job's tree"
    ev = accelerate_failure(helper_at=T)
    root = root_incident(ev)
    assert root is not None and (root.pid, root.weight) == (RANK1, CAUSE)
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("python-exception", RANK1, 1)
    assert "ValueError: loss is nan" in first.summary
    assert_well_formed(explain(ev))


def test_a_helpers_exit_the_job_reacted_to_still_leads() -> None:
    # rank 0 was torn down right after the helper's exit: that exit changed something, and came first
    ev = accelerate_failure(helper_at=T)
    teardown = rank_death(RANK0, 0, T + 0.3, None, "SIGTERM")
    ev = dataclasses.replace(ev, deaths=(ev.deaths[0], teardown, ev.deaths[1], ev.deaths[3]))
    assert root_incident(ev).pid == HELPER  # type: ignore[union-attr]


def test_a_kill_after_a_helpers_exit_still_does_not_outrank_it() -> None:
    # a kill is no failure with its own evidence: it may be the reaction (Ray's shutdown), so the exit leads
    ev = accelerate_failure(helper_at=T)
    killed = rank_death(RANK1, 1, T + 2.05, None, "SIGKILL")
    ev = dataclasses.replace(ev, deaths=(ev.deaths[0], killed, *ev.deaths[2:]), exceptions=ev.exceptions[1:])
    assert root_incident(ev).pid == HELPER  # type: ignore[union-attr]


def test_a_killed_rank_the_shim_saw_without_its_rank_is_named_by_torchruns_report() -> None:
    """The shim held the rank from the kernel's fork event, as a copy of torchrun, and it was killed before
    its exec was looked at: no rank, torchrun's command line. torchrun's report names its rank and pid."""
    from .test_mltext import agent_pid_of_failure, log

    lines = log("torchrun-rank-killed")
    _, killed = agent_pid_of_failure(lines)
    as_forked = "python torchrun --nproc_per_node 2 train.py"  # its command line before its exec
    ev = failed(
        log_tail=tuple(lines),
        deaths=(
            ProcessDeath(killed, MAIN, as_forked, T + 0.1, None, "SIGKILL"),
            rank_death(RANK0, 0, T + 0.2, None, "SIGTERM"),
            main_death(T + 0.4),
        ),
    )
    first = explain(ev)[0]
    assert (first.rule, first.pids[0], first.rank) == ("killed-externally", killed, 1)
    assert first.title.startswith(f"Rank 1 (pid {killed})"), first.title
