"""The death rules, with recorded evidence: each rule where it fires, and where it must not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobwarden.model import Finding
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.death import parse_traceback

SEVERITIES = {"critical", "error", "warning", "info"}

# Captured from CPython 3.11 (`python train.py` with the data directory missing): an exception raised
# while handling another, so two tracebacks; the second one is what killed the process.
CHAINED_TRACEBACK = """\
epoch 0 step 100 loss 2.31
loading shard 7
Traceback (most recent call last):
  File "/srv/train/data.py", line 41, in load_shard
    with open(path, "rb") as fh:
         ^^^^^^^^^^^^^^^^
FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7.bin'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/train/train.py", line 88, in <module>
    main()
  File "/srv/train/train.py", line 80, in main
    batch = next(loader)
            ^^^^^^^^^^^^
  File "/srv/train/data.py", line 44, in load_shard
    raise RuntimeError(f"shard {n} is missing; was the dataset synced?")
RuntimeError: shard 7 is missing; was the dataset synced?
""".splitlines()

# Captured from a PyTorch job that ran out of GPU memory (message shortened).
CUDA_OOM_TRACEBACK = """\
Traceback (most recent call last):
  File "/home/ana/exp/train.py", line 120, in <module>
    loss = model(batch).loss
           ^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/activations.py", line 78, in forward
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))
                                                                                          ^^^^^^^^^^^^^^^^^^^^^^
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 9.50 MiB is free.
""".splitlines()  # noqa: E501

ORPHANS = [
    {"pid": 4711, "cmdline": "python -m torch.utils.data worker"},
    {"pid": 4712, "cmdline": "python -m torch.utils.data worker"},
]


def evidence(**changes: Any) -> RunEvidence:
    """A clean run of `python train.py`: changes make it die in one way or another."""
    base = RunEvidence(
        state="succeeded",
        exit_code=0,
        signal=None,
        end_reason="exited",
        pid=4665,
        log_tail=("epoch 9 step 1000 loss 0.12", "saved checkpoint ckpt-9.pt"),
    )
    return dataclasses.replace(base, **changes)


def rules_of(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def assert_well_formed(findings: list[Finding]) -> None:
    for f in findings:
        assert f.title and f.summary, f
        assert f.severity in SEVERITIES, f
        assert f.evidence and all(isinstance(e, str) and e for e in f.evidence), f
        assert f.remedy, f
        assert f.to_json()["rule"] == f.rule


# --- each rule where it fires ---------------------------------------------------------------------


def test_stopped_by_user() -> None:
    ev = evidence(state="stopped", exit_code=None, signal="SIGTERM", end_reason="stopped")
    findings = explain(ev)
    assert rules_of(findings) == ["stopped-by-user"]
    assert findings[0].severity == "info"
    assert findings[0].pids == (4665,)
    assert "SIGTERM" in findings[0].summary
    assert "`jobwarden rerun " in findings[0].remedy and "does not resume" in findings[0].remedy
    assert_well_formed(findings)


def test_stopped_by_user_when_the_job_exited_on_its_own_signal_handler() -> None:
    ev = evidence(state="stopped", exit_code=143, signal=None, end_reason="stopped")
    findings = explain(ev)
    assert rules_of(findings) == ["stopped-by-user"]
    assert "exit code 143" in findings[0].summary


def test_timeout() -> None:
    ev = evidence(state="failed", exit_code=None, signal="SIGTERM", end_reason="timeout", timeout_s=43200.0)
    findings = explain(ev)
    assert rules_of(findings) == ["timeout"]
    assert "43200s" in findings[0].title
    assert "--timeout of 43200s" in findings[0].evidence
    assert "output: saved checkpoint ckpt-9.pt" in findings[0].evidence
    assert_well_formed(findings)


def test_python_exception_names_the_last_of_chained_tracebacks() -> None:
    ev = evidence(state="failed", exit_code=1, end_reason="exited", log_tail=CHAINED_TRACEBACK)
    findings = explain(ev)
    assert rules_of(findings) == ["python-exception"]
    (f,) = findings
    assert f.title == "Uncaught RuntimeError"
    assert f.summary == "RuntimeError: shard 7 is missing; was the dataset synced?"
    assert "raised at /srv/train/data.py:44 in load_shard" in f.evidence
    assert "exit code 1" in f.evidence
    assert "/srv/train/data.py:44 in load_shard" in f.remedy
    assert "FileNotFoundError" not in f.summary
    assert_well_formed(findings)


def test_python_exception_with_a_dotted_class_name() -> None:
    ev = evidence(state="failed", exit_code=1, end_reason="exited", log_tail=CUDA_OOM_TRACEBACK)
    cuda, f = explain(ev)
    assert cuda.rule == "cuda-oom"  # the cause first; the exception says where it surfaced
    assert f.rule == "python-exception"
    assert f.title == "Uncaught torch.cuda.OutOfMemoryError"
    assert f.summary.startswith("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00")
    assert any(e.startswith("raised at ") and "activations.py:78 in forward" in e for e in f.evidence)


def test_python_exception_with_an_empty_message_and_colon() -> None:
    tail = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "KeyError: "]
    (f,) = explain(evidence(state="failed", exit_code=1, log_tail=tail))
    assert f.rule == "python-exception"
    assert f.title == "Uncaught KeyError"


@pytest.mark.parametrize("last_line", ["AssertionError", "ValueError", "mylib.errors.ConfigError"])
def test_python_exception_without_a_message(last_line: str) -> None:
    tail = [
        "Traceback (most recent call last):",
        '  File "/srv/train/train.py", line 12, in <module>',
        "    assert batch.shape[0] > 0",
        last_line,
    ]
    findings = explain(evidence(state="failed", exit_code=1, log_tail=tail))
    assert rules_of(findings) == ["python-exception"]
    assert findings[0].title == f"Uncaught {last_line}"


def test_terminal_hangup() -> None:
    ev = evidence(state="failed", exit_code=None, signal="SIGHUP", end_reason="signalled")
    findings = explain(ev)
    assert rules_of(findings) == ["terminal-hangup"]
    assert "main process 4665 killed by SIGHUP" in findings[0].evidence
    assert_well_formed(findings)


def test_broken_pipe() -> None:
    ev = evidence(state="failed", exit_code=None, signal="SIGPIPE", end_reason="signalled")
    findings = explain(ev)
    assert rules_of(findings) == ["broken-pipe"]
    assert_well_formed(findings)


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"])
def test_native_crash(sig: str) -> None:
    tail = (
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        '  File "/home/ana/ext.py", line 4 in read_null',
        '  File "/home/ana/train.py", line 9 in <module>',
        "",
        "Extension modules: numpy.core._multiarray_umath (total: 1)",
    )
    ev = evidence(state="failed", exit_code=None, signal=sig, end_reason="signalled", log_tail=tail)
    findings = explain(ev)
    assert rules_of(findings) == ["native-crash"]
    assert findings[0].severity == "critical"
    assert sig in findings[0].title and "read_null" in findings[0].title
    assert "faulthandler: Segmentation fault" in findings[0].evidence
    assert "  at read_null (/home/ana/ext.py:4)" in findings[0].evidence
    assert "read_null (/home/ana/ext.py:4)" in findings[0].remedy
    assert_well_formed(findings)


def test_native_crash_without_a_faulthandler_report_quotes_the_output() -> None:
    tail = ("loading weights", "", "Segmentation fault (core dumped)")
    ev = evidence(state="failed", exit_code=None, signal="SIGSEGV", end_reason="signalled", log_tail=tail)
    (finding,) = explain(ev)
    assert "output: Segmentation fault (core dumped)" in finding.evidence
    assert "output: " not in finding.evidence  # blank lines are not evidence


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT"])
def test_killed_externally(sig: str) -> None:
    ev = evidence(state="failed", exit_code=None, signal=sig, end_reason="signalled")
    findings = explain(ev)
    assert rules_of(findings) == ["killed-externally"]
    assert findings[0].pids == (4665,)
    assert_well_formed(findings)


def test_an_unusual_signal_is_reported_as_such() -> None:
    ev = evidence(state="failed", exit_code=None, signal="SIGUSR2", end_reason="signalled")
    findings = explain(ev)
    assert rules_of(findings) == ["exit-code"]
    assert findings[0].title == "Killed by SIGUSR2"
    assert_well_formed(findings)


def test_exit_code() -> None:
    ev = evidence(state="failed", exit_code=3, end_reason="exited", log_tail=("config: bad value",))
    findings = explain(ev)
    assert rules_of(findings) == ["exit-code"]
    assert findings[0].title == "Exited with code 3"
    assert findings[0].evidence == ("exit code 3", "output: config: bad value")
    assert_well_formed(findings)


def test_exit_code_of_a_silent_job() -> None:
    (f,) = explain(evidence(state="failed", exit_code=2, log_tail=()))
    assert f.evidence == ("exit code 2", "the job wrote no output")


def test_exit_code_evidence_is_the_last_non_blank_lines() -> None:
    tail = (*(f"line {i}" for i in range(20)), "", "   ")
    (f,) = explain(evidence(state="failed", exit_code=1, log_tail=tail))
    assert f.evidence == ("exit code 1", *(f"output: line {i}" for i in range(15, 20)))


def test_spawn_failed() -> None:
    ev = evidence(
        state="failed",
        exit_code=127,
        end_reason="spawn-failed",
        pid=None,
        error="exec of 'pyhton' failed: No such file or directory",
        log_tail=(),
    )
    findings = explain(ev)
    assert rules_of(findings) == ["exit-code"]
    assert findings[0].summary == "exec of 'pyhton' failed: No such file or directory"
    assert_well_formed(findings)
    assert findings[0].evidence == ("exit code 127",)


def test_a_run_its_supervisor_never_started_blames_jobwarden_not_the_command() -> None:
    ev = evidence(
        state="failed",
        exit_code=None,
        end_reason="supervisor-failed",
        pid=None,
        error="the supervisor of job 3 exited before starting it",
        log_tail=(),
    )
    findings = explain(ev)
    assert rules_of(findings) == ["supervisor-lost"]
    assert findings[0].title == "The supervisor (shim) died before it started the job"
    assert findings[0].evidence == ("no process was started: the run has no pid and no exit code",)
    assert "fault in jobwarden" in findings[0].remedy
    assert_well_formed(findings)


def test_orphans_left() -> None:
    ev = evidence(state="failed", exit_code=1, orphans_left=ORPHANS)
    findings = explain(ev)
    assert rules_of(findings) == ["exit-code", "orphans-left"]
    orphans = findings[1]
    assert orphans.pids == (4711, 4712)
    assert orphans.evidence == (
        "pid 4711: python -m torch.utils.data worker",
        "pid 4712: python -m torch.utils.data worker",
    )
    assert orphans.summary.endswith("2 of its descendants were still running; jobwarden ended them.")
    assert_well_formed(findings)


def test_one_orphan_is_counted_in_the_singular() -> None:
    (orphans,) = [f for f in explain(evidence(orphans_left=ORPHANS[:1])) if f.rule == "orphans-left"]
    assert orphans.summary.startswith("When the main process ended, 1 of its descendants was still running")
    assert "were" not in orphans.summary


def test_orphans_left_that_survived_the_cleanup() -> None:
    survivors = [{"pid": 4712, "cmdline": "python worker", "reason": "in D state (uninterruptible)"}]
    ev = evidence(orphans_left=ORPHANS, survivors=survivors)
    (f,) = explain(ev)
    assert f.rule == "orphans-left"
    assert "could not all be ended" in f.summary


def test_orphans_evidence_lists_at_most_ten() -> None:
    many = [{"pid": 5000 + i, "cmdline": "sleep 1000"} for i in range(25)]
    (f,) = explain(evidence(orphans_left=many))
    assert len(f.evidence) == 10
    assert len(f.pids) == 25
    assert f.title.startswith("25 ")


def test_supervisor_lost() -> None:
    ev = evidence(state="lost", exit_code=None, end_reason=None)
    findings = explain(ev)
    assert rules_of(findings) == ["supervisor-lost"]
    assert findings[0].evidence == ("event: supervisor-lost",)
    assert_well_formed(findings)


def test_supervisor_lost_from_the_event_after_adoption() -> None:
    # Adopted and then ended: the state moved on, the event log remembers the lost supervisor.
    ev = evidence(state="failed", exit_code=1, events=("created", "started", "supervisor-lost", "adopted"))
    assert rules_of(explain(ev)) == ["exit-code", "supervisor-lost"]


# --- order: the root cause first, then what contributed -------------------------------------------


def test_root_cause_first_then_orphans_then_supervisor() -> None:
    ev = evidence(
        state="failed",
        exit_code=None,
        signal="SIGTERM",
        end_reason="timeout",
        timeout_s=60.0,
        orphans_left=ORPHANS,
        events=("supervisor-lost",),
    )
    findings = explain(ev)
    assert rules_of(findings) == ["timeout", "orphans-left", "supervisor-lost"]
    assert_well_formed(findings)


def test_only_one_root_cause_even_when_several_match() -> None:
    # Stopped by the user while a traceback was already in the log: the stop is the cause.
    ev = evidence(state="stopped", exit_code=1, end_reason="stopped", log_tail=CHAINED_TRACEBACK)
    assert rules_of(explain(ev)) == ["stopped-by-user"]


# --- where rules must not fire --------------------------------------------------------------------


def test_a_clean_run_has_no_findings() -> None:
    assert explain(evidence()) == []


def test_a_running_job_has_no_findings() -> None:
    assert explain(evidence(state="running", exit_code=None, end_reason=None)) == []


def test_exit_0_with_orphans_is_only_orphans_left() -> None:
    assert rules_of(explain(evidence(orphans_left=ORPHANS))) == ["orphans-left"]


def test_a_traceback_in_the_log_of_a_successful_run_is_not_a_python_exception() -> None:
    # The job caught and logged the exception, retried, and exited 0.
    assert explain(evidence(log_tail=(*CHAINED_TRACEBACK, "retrying with shard 8", "done"))) == []


def test_a_traceback_before_a_signal_death_is_not_the_cause() -> None:
    ev = evidence(state="failed", exit_code=None, signal="SIGKILL", log_tail=CHAINED_TRACEBACK)
    assert rules_of(explain(ev)) == ["killed-externally"]


def test_a_failure_without_a_traceback_is_not_a_python_exception() -> None:
    tail = ("Error: could not connect to redis", "exiting")
    assert rules_of(explain(evidence(state="failed", exit_code=1, log_tail=tail))) == ["exit-code"]


def test_a_traceback_header_without_an_exception_line_is_not_a_python_exception() -> None:
    # The log tail was cut inside the traceback (the job was still writing it).
    tail = CHAINED_TRACEBACK[: CHAINED_TRACEBACK.index('  File "/srv/train/train.py", line 80, in main')]
    assert rules_of(explain(evidence(state="failed", exit_code=1, log_tail=tail))) == ["exit-code"]


def test_a_sigterm_from_stop_is_stopped_by_user_not_killed_externally() -> None:
    ev = evidence(state="stopped", exit_code=None, signal="SIGTERM", end_reason="stopped")
    assert "killed-externally" not in rules_of(explain(ev))


def test_a_sigkill_after_the_stop_grace_is_still_stopped_by_user() -> None:
    ev = evidence(state="stopped", exit_code=None, signal="SIGKILL", end_reason="stopped")
    assert rules_of(explain(ev)) == ["stopped-by-user"]


def test_a_timeout_is_timeout_not_killed_externally() -> None:
    for sig in ("SIGTERM", "SIGKILL"):
        ev = evidence(state="failed", exit_code=None, signal=sig, end_reason="timeout")
        assert rules_of(explain(ev)) == ["timeout"]


def test_a_timeout_without_a_recorded_limit() -> None:
    (f,) = explain(evidence(state="failed", exit_code=None, signal="SIGTERM", end_reason="timeout"))
    assert f.title == "Ended by the --timeout"


def test_no_supervisor_lost_without_the_state_or_the_event() -> None:
    ev = evidence(state="failed", exit_code=1, events=("created", "started", "exited"))
    assert "supervisor-lost" not in rules_of(explain(ev))


def test_rules_are_pure_the_same_evidence_gives_the_same_findings() -> None:
    ev = evidence(state="failed", exit_code=1, log_tail=CHAINED_TRACEBACK, orphans_left=ORPHANS)
    assert explain(ev) == explain(ev)
    assert ev.log_tail == CHAINED_TRACEBACK  # not consumed or changed


# --- parse_traceback ------------------------------------------------------------------------------


def test_parse_traceback_returns_type_message_and_innermost_frame() -> None:
    assert parse_traceback(CHAINED_TRACEBACK) == (
        "RuntimeError",
        "shard 7 is missing; was the dataset synced?",
        "/srv/train/data.py:44 in load_shard",
    )


def test_parse_traceback_of_output_without_one() -> None:
    assert parse_traceback(["hello", "Error: no traceback here"]) is None
    assert parse_traceback([]) is None


def test_a_supervisor_lost_in_the_restart_backoff_never_says_the_job_ran_unsupervised() -> None:
    events = ("created", "restarting", "supervisor-lost")
    (lost,) = explain(evidence(state="lost", exit_code=None, end_reason=None, pid=None, events=events))
    assert lost.rule == "supervisor-lost" and lost.title.endswith("during the restart backoff")
    assert "nothing of the job ran unsupervised" in lost.summary and "never made" in lost.summary
    assert lost.severity == "warning" and "`jobwarden adopt JOB` starts this run now" in lost.remedy
    # adopted: the restart was made under a new supervisor, and the run goes on
    carried = (*events, "restart-adopted", "started")
    (after,) = explain(evidence(state="running", exit_code=None, end_reason=None, events=carried))
    assert "carried on with the restart" in after.summary and after.severity == "info"
    # a supervisor lost after this run had started: the job did run on unsupervised
    (later,) = explain(
        evidence(
            state="lost", exit_code=None, end_reason=None, events=("restarting", "started", "supervisor-lost")
        )
    )
    assert "ran on unsupervised" in later.summary
