"""How explain() combines the families: the root cause first, one exit-status finding, nothing twice; and
the py-spy loader the rule tests stand on."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from jobwarden.model import Finding
from jobwarden.observations import OomEvidence, ProcessFacts
from jobwarden.rules import explain
from jobwarden.rules.verdict import ORDER
from tests.fixtures.stacks.pyspy import HERE, frame, process_stack, recording

from .test_rules import assert_well_formed, rules_of

REPO = Path(__file__).resolve().parents[2]
# shared/ sits beside the checkout (a worktree is one level deeper)
DESIGNS = [REPO.parent / "shared" / "DESIGN.md", REPO.parent.parent / "shared" / "DESIGN.md"]
SCENARIOS = sorted({p.name.split(".")[0] for p in HERE.glob("*.facts.json")})
MACHINE_WIDE = {"stray-gpu-process"}  # judged by rules.gpu.stray_gpu_findings, not per run
# Rules this project added beyond the design's table (the README's rule list names them too)
ADDED = {"disk-full", "machine-rebooted", "dependency-failed", "notify-failed", "wait-chain"}
# ... and speed rules the design names outside its speed table (`straggler`: its "Ranks" section)
SPEED_ADDED = {"straggler"}


def test_order_covers_every_per_run_rule_of_the_design() -> None:
    design = next((p for p in DESIGNS if p.exists()), None)
    if design is None:
        pytest.skip("the shared design document is not beside this checkout")
    per_run = design.read_text().partition("Speed rules")[0]  # those judge a running job: rules.speed
    table = re.findall(r"^\| `([a-z-]+)` \|", per_run, flags=re.MULTILINE)
    assert (set(table) - MACHINE_WIDE) | ADDED == set(ORDER)
    assert len(ORDER) == len(set(ORDER))


def test_the_speed_rules_are_the_designs_speed_table() -> None:
    from jobwarden.rules.speed import SPEED_RULES

    design = next((p for p in DESIGNS if p.exists()), None)
    if design is None:
        pytest.skip("the shared design document is not beside this checkout")
    speed = design.read_text().partition("Speed rules")[2].partition("\n## ")[0]
    table = re.findall(r"^\| `([a-z-]+)` \|", speed, flags=re.MULTILINE)
    assert set(table) | SPEED_ADDED == SPEED_RULES and len(table) + len(SPEED_ADDED) == len(SPEED_RULES)
    assert not set(table) & SPEED_ADDED
    assert not SPEED_RULES & set(ORDER)  # judged on a running job, never ranked as a root cause


def test_oom_then_the_lost_worker_then_the_users_stop() -> None:
    rec = recording("pool_sigkill")
    (dead,) = rec.deaths()
    ev = rec.evidence(
        hung=False,
        state="stopped",
        end_reason="stopped",
        signal="SIGTERM",
        oom=OomEvidence("cgroup-v1", 1, limit_bytes=300 << 20, victims=(dead.pid,)),
    )
    assert rules_of(explain(ev)) == ["oom-kill", "pool-worker-lost", "stopped-by-user"]


def test_a_hang_signature_comes_before_the_timeout_that_ended_it() -> None:
    ended = {"end_reason": "timeout", "signal": "SIGTERM", "state": "failed", "timeout_s": 3600.0}
    ev = recording("fork_mp").evidence(**ended)
    assert rules_of(explain(ev)) == ["fork-deadlock", "timeout"]


def test_a_stopped_process_comes_before_the_hang_it_causes() -> None:
    # The stopped process leaves the others idle; the watchdog judged a hang. No no-progress on top.
    rec = recording("stopped")
    assert rules_of(explain(rec.evidence(hung=True))) == ["process-stopped"]


def test_no_progress_only_when_nothing_explains_the_hang() -> None:
    assert rules_of(explain(recording("dstate").evidence())) == ["uninterruptible-io"]
    assert rules_of(explain(recording("deadlock").evidence())) == ["no-progress"]


def test_one_exit_finding_after_the_causes_and_the_aftermath_last() -> None:
    rec = recording("pool_sigkill")
    ev = rec.evidence(
        hung=False,
        state="lost",
        exit_code=1,
        orphans_left=[{"pid": rec.pid("replacement"), "cmdline": "python pool_sigkill.py"}],
        log_tail=("Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "KeyError: 3"),
    )
    expected = ["pool-worker-lost", "python-exception", "orphans-left", "supervisor-lost"]
    assert rules_of(explain(ev)) == expected


@pytest.mark.parametrize("hung", [True, False], ids=["hung", "live"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_finding_on_every_recording_is_well_formed_and_ordered(name: str, hung: bool) -> None:
    findings = explain(recording(name).evidence(hung=hung))
    assert_well_formed(findings)
    assert [ORDER.index(f.rule) for f in findings] == sorted(ORDER.index(f.rule) for f in findings)
    assert len({f.rule for f in findings}) == len(findings)  # one finding per rule, listing every pid
    for f in findings:
        assert f.pids, f
        assert all(isinstance(p, int) for p in f.pids)
        assert Finding.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_explain_is_pure() -> None:
    ev = recording("pool_sigkill").evidence()
    before = dataclasses.replace(ev)
    assert explain(ev) == explain(ev)
    assert ev == before


# --- the py-spy loader ----------------------------------------------------------------------------


def test_loader_marks_native_frames_and_drops_their_zero_line() -> None:
    raw = json.loads((HERE / "fork_mp.child.native.json").read_text())
    stack = process_stack(raw)
    (thread,) = stack.threads
    assert thread.name == "MainThread" and thread.tid == stack.pid
    assert thread.active is False and thread.owns_gil is False
    natives = [f for f in thread.frames if f.native]
    assert [f.function for f in natives if not f.function.startswith("0x")] == [
        "PyThread_acquire_lock_timed",
        "lock_PyThread_acquire_lock",
    ]
    assert all(f.line is None for f in natives)
    py = [f for f in thread.frames if not f.native]
    assert py[0].function == "load_shard" and py[0].line is not None and py[0].file.endswith("fork_mp.py")


def test_loader_keeps_line_numbers_py_spy_found_in_native_debug_info() -> None:
    data = {"name": "_queue_SimpleQueue_get_impl", "filename": "_queuemodule.c", "module": "/a.so", "line": 9}
    assert frame(data).native and frame(data).line == 9


def test_recordings_have_the_processes_the_rules_need() -> None:
    rec = recording("pool_sigkill")
    assert rec.python.startswith("3.11")
    parent = rec.process("parent")
    assert isinstance(parent, ProcessFacts) and parent.is_main and len(parent.thread_states) == 4
    assert {d.signal for d in rec.deaths()} == {"SIGKILL"}
    assert recording("fork_os_py38").python.startswith("3.8")
    assert recording("fork_mp_py313").python.startswith("3.13")


def test_the_rule_table_is_the_order_ps_ranks_by() -> None:
    # ps reads model.ROOT_CAUSE_ORDER so as not to load the rules (~50 ms): it must be the table's order
    from jobwarden.model import ROOT_CAUSE_ORDER
    from jobwarden.rules.table import RULES

    assert tuple(rule.id for rule in RULES) == ROOT_CAUSE_ORDER == ORDER
    assert all(rule.judge is not None for rule in RULES if rule.live)
