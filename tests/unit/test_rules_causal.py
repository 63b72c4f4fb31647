"""The causal verdict across the tree (rules.causal): the process that failed first leads, the wrapper
exceptions of its parents and a launcher's teardown are evidence under it, never the root cause."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from jobwarden.model import Finding
from jobwarden.observations import Frame, ProcessDeath, ProcessStack, ThreadStack, UncaughtException
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.causal import CAUSE, REPORT, TEARDOWN, incidents, root_incident

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
