"""The logic of an attached run (inside Slurm or Ray): the engine-stop budget arithmetic, what scontrol's
answers mean, the CLI's signal relay, the rule `cancelled-by-engine`, and the options it refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.control import attached
from jobwarden.control.options import engine_options, run_options
from jobwarden.errors import UsageError
from jobwarden.osapi.process import BLOCKED_UNTIL_HANDLED, RELAYED_USR1, fork_attached
from jobwarden.probes.slurm import config_kill_wait, kill_wait_s, parse_job_state, parse_kill_wait
from jobwarden.rules import RunEvidence, explain
from jobwarden.rules.retry import AttemptOutcome, RestartPolicy, decide
from jobwarden.shim.run.enginestop import grace_within, margin_s, stacks_cap_s


@pytest.mark.parametrize(
    ("budget", "cap", "margin"), [(5, 1.25, 2.5), (30, 5.0, 3.0), (3, 0.75, 1.5), (120, 5, 3)]
)
def test_stacks_take_a_quarter_of_the_budget_at_most_5s_and_a_margin_is_kept(
    budget: float, cap: float, margin: float
) -> None:
    assert stacks_cap_s(budget) == cap
    assert margin_s(budget) == margin


def test_the_grace_fits_what_is_left_of_the_budget() -> None:
    # KillWait=5, 1 s spent on stacks: 5 - 1 - 2.5 leaves 1.5 s of the asked 10 s
    assert grace_within(5, 10, 1.0) == 1.5
    assert grace_within(30, 10, 1.0) == 10  # a long KillWait: the asked grace
    assert grace_within(3, 10, 0.5) == 1.0  # Ray's 3 s
    assert grace_within(5, 10, 4.0) == 0.0  # nothing left: SIGKILL at once, never a negative wait


def test_kill_wait_from_scontrol_show_config() -> None:
    text = "JobCompType             = jobcomp/filetxt\nKillWait                = 5 sec\nMinJobAge = 300 sec\n"
    assert parse_kill_wait(text) == 5.0
    assert parse_kill_wait("SlurmctldPort = 6817\n") is None


def test_kill_wait_from_slurm_conf_without_asking_scontrol(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\n# KillWait=99 (a comment)\nkillwait = 7\nNodeName=n1 CPUs=2\n")
    assert kill_wait_s({"SLURM_CONF": str(conf), "PATH": ""}) == 7.0  # no scontrol on this PATH
    assert config_kill_wait("ClusterName=lab\n") == 30.0  # Slurm's default when unset
    assert config_kill_wait("KillWait=5\nInclude /etc/slurm/nodes.conf\n") is None  # it may be set there


@pytest.mark.parametrize(
    ("line", "state"),
    [
        ("JobId=7 JobName=x JobState=COMPLETING Reason=None Dependency=(null)", "CANCELLED"),  # scancel
        ("JobId=7 JobName=x JobState=COMPLETING Reason=TimeLimit Dependency=(null)", "TIMEOUT"),
        ("JobId=7 JobName=x JobState=RUNNING Reason=None", "RUNNING"),
        ("JobId=7 JobName=x JobState=CANCELLED Reason=None", "CANCELLED"),
    ],
)
def test_why_slurm_ends_the_job_from_scontrol_show_job(line: str, state: str) -> None:
    found = parse_job_state(line)
    assert found is not None and found.state == state
    assert parse_job_state("slurm_load_jobs error: Invalid job id specified") is None


def test_the_engine_budget_of_ray_is_its_stop_wait() -> None:
    assert attached.engine_budget_s("ray", {}) == 3.0
    assert attached.engine_budget_s("ray", {"RAY_JOB_STOP_WAIT_TIME_S": "20"}) == 20.0
    assert attached.engine_budget_s("ray", {"RAY_JOB_STOP_WAIT_TIME_S": "soon"}) == 3.0


def test_slurm_that_does_not_answer_gives_the_default_budget() -> None:
    assert attached.engine_budget_s("slurm", {"PATH": "/nonexistent"}) == 30.0


# A stand-in shim: catches what the CLI relays and says which signal came
CATCHER = f"""
import signal, sys
for sig in (signal.SIGTERM, signal.SIGHUP, {int(RELAYED_USR1)}):
    signal.signal(sig, lambda n, _: print(n, flush=True))
print("ready", flush=True)
sys.stdin.read()
"""


def test_the_relay_holds_signals_until_the_shim_exists() -> None:
    shim = subprocess.Popen([sys.executable, "-c", CATCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert shim.stdout is not None
    try:
        assert shim.stdout.readline() == b"ready\n"
        relay = attached.SignalRelay()
        relay._caught(signal.SIGTERM, None)  # held: no shim yet
        relay.attach(shim.pid)
        relay._caught(signal.SIGUSR1, None)  # the shim's own SIGUSR1 means `jobwarden stop`: relayed apart
        relay._caught(signal.SIGHUP, None)
        # all three pending at once arrive in the kernel's order (lowest number first), not in sending order
        got = sorted(int(shim.stdout.readline()) for _ in range(3))
        assert got == sorted([signal.SIGTERM, RELAYED_USR1, signal.SIGHUP])
        assert relay.shim_pidfd is not None
        os.close(relay.shim_pidfd)
    finally:
        shim.kill()
        shim.communicate()


def test_the_relay_never_sends_a_signal_the_shim_would_die_of() -> None:
    """A process that neither catches nor blocks the relayed real-time signal would be ended by it."""
    shim = subprocess.Popen(["sleep", "60"])
    try:
        relay = attached.SignalRelay()
        relay.attach(shim.pid)
        relay._caught(signal.SIGUSR1, None)
        relay._caught(signal.SIGTERM, None)
        assert shim.poll() is None
        assert relay.shim_pidfd is not None
        os.close(relay.shim_pidfd)
    finally:
        shim.kill()
        shim.wait()


def test_the_relay_never_signals_a_reaped_shims_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's signal after the CLI reaped its shim: the pid may name another process by then."""
    shim = subprocess.Popen(["sleep", "60"])
    relay = attached.SignalRelay()
    try:
        relay.attach(shim.pid)
    finally:
        shim.kill()
        shim.wait()
    monkeypatch.setattr(os, "kill", lambda pid, sig: pytest.fail(f"os.kill({pid}, {sig})"))
    relay._caught(signal.SIGTERM, None)  # through the pidfd: not delivered, and no error
    assert relay.shim_pidfd is not None
    os.close(relay.shim_pidfd)


def _engine_ended(**fields: object) -> RunEvidence:
    base: dict[str, object] = {
        "state": "stopped",
        "exit_code": 143,
        "signal": None,
        "end_reason": "engine-stop",
        "pid": 99,
        "engine": "slurm",
        "engine_budget_s": 5.0,
        "engine_signal": "SIGTERM",
        "engine_signal_at": 1_800_000_000.0,
    }
    return RunEvidence(**{**base, **fields})  # type: ignore[arg-type]


def test_a_time_limit_names_the_checkpoint_signal_or_a_longer_time() -> None:
    (finding,) = explain(_engine_ended(engine_state="TIMEOUT", engine_reason="TimeLimit"))
    assert finding.rule == "cancelled-by-engine"
    assert finding.title == "Ended by Slurm at the job's time limit"
    assert "--signal=USR1@" in finding.remedy and "--time" in finding.remedy
    assert any("TIMEOUT" in line for line in finding.evidence)


def test_a_job_that_outlived_the_grace_says_what_budget_to_raise() -> None:
    (finding,) = explain(_engine_ended(engine_state="CANCELLED", signal="SIGKILL", exit_code=None))
    assert finding.title == "Cancelled by Slurm (scancel)"
    assert "KillWait" in finding.remedy
    (ray,) = explain(_engine_ended(engine="ray", engine_budget_s=3.0, signal="SIGKILL", exit_code=None))
    assert "RAY_JOB_STOP_WAIT_TIME_S" in ray.remedy


def test_an_engine_stop_is_never_the_users_stop_nor_an_outside_kill() -> None:
    rules = [f.rule for f in explain(_engine_ended(signal="SIGTERM", exit_code=None))]
    assert rules == ["cancelled-by-engine"]


def test_an_engine_stop_is_never_restarted_by_jobwarden() -> None:
    outcome = AttemptOutcome(state="stopped", signal="SIGTERM", end_reason="engine-stop")
    decision = decide(RestartPolicy("always", 3), [outcome])
    assert not decision.restart and "engine" in decision.reason


def test_mem_limit_under_slurm_says_mem_is_the_tool() -> None:
    engine = engine_options({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})
    with pytest.raises(UsageError) as raised:
        run_options(mem_limit="8G", engine=engine)
    assert "--mem-limit" in raised.value.message and "--mem=" in (raised.value.remedy or "")
    assert run_options(mem_limit="8G", engine=engine_options({})).mem_limit_bytes == 8 << 30


def test_an_attached_shim_is_forked_with_what_the_cli_relays_blocked() -> None:
    """Until its handlers are in, a relayed signal waits: RELAYED_USR1 (real-time) would otherwise end it."""
    pid = fork_attached()
    if pid == 0:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        os._exit(0 if set(blocked) >= BLOCKED_UNTIL_HANDLED and RELAYED_USR1 in blocked else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert RELAYED_USR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the parent's mask is back
