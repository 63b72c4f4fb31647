"""--engine and the group flags: the engine is found from a task's environment, its defaults fill what
was not given, and a requeue code that srun would mask is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.control.engine import detect_engine, engine_place, slurm_group
from jobwarden.control.options import engine_options, run_options
from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions

SLURM_TASK = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURMD_NODENAME": "n2",
    "SLURM_CLUSTER_NAME": "lab",
}


def test_slurm_is_found_by_its_variables_and_nothing_else() -> None:
    assert detect_engine("auto", SLURM_TASK) == "slurm"
    assert detect_engine("auto", {"RAY_ADDRESS": "127.0.0.1:6379"}) is None
    assert detect_engine("none", SLURM_TASK) is None
    assert detect_engine("ray", {}) == "ray"


def test_a_slurm_task_gets_its_group_attempt_rank_and_node() -> None:
    place = engine_place("slurm", {**SLURM_TASK, "SLURM_RESTART_COUNT": "2"})
    assert place == ("slurm", "slurm-lab-42", 2, 3, "n2")
    assert engine_place("slurm", SLURM_TASK).attempt == 0


def test_an_array_task_is_its_own_group() -> None:
    env = {"SLURM_JOB_ID": "57", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7"}
    assert slurm_group(env) == "slurm-50_7"


def test_given_flags_win_over_the_engine_and_detach_keeps_the_group() -> None:
    options = engine_options(SLURM_TASK, group="mine", rank="0", detach=True)
    assert options["engine"] is None
    assert (options["group"], options["rank"], options["node"]) == ("mine", 0, "n2")
    # detached, still in Slurm's task cgroup: no memory cgroup of its own to hide an OOM from Slurm
    assert run_options(engine=options).own_cgroup is False
    assert run_options(engine=engine_options({})).own_cgroup is True


def test_the_options_are_stored_and_read_back() -> None:
    engine = engine_options(SLURM_TASK, requeue_exit="200", max_requeues="3")
    options = run_options(engine=engine)
    assert JobOptions.from_json(options.to_json()) == options
    assert (options.engine, options.requeue_exit, options.max_requeues) == ("slurm", 200, 3)


@pytest.mark.parametrize("code", ["75", "143", "253", "256", "two hundred"])
def test_a_requeue_code_srun_would_mask_is_refused_naming_the_flag(code: str) -> None:
    with pytest.raises(UsageError, match="--requeue-exit"):
        engine_options({}, requeue_exit=code)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"engine": "k8s"}, "--engine"),
        ({"group": "a/b"}, "--group"),
        ({"rank": "-1"}, "--rank"),
        ({"max_requeues": ""}, "--max-requeues"),
        ({"group": "g", "group_dir": ""}, "--group-dir"),
        ({"group_dir": "/shared/groups"}, "--group-dir"),  # no group to put there, outside Slurm
    ],
)
def test_bad_engine_flags_name_their_flag(flags: dict[str, str], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        engine_options({}, **flags)


def test_a_relative_group_dir_is_made_absolute_for_the_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert engine_options({}, group="g", group_dir="groups")["group_dir"] == str(tmp_path / "groups")


def test_mem_limit_is_refused_under_slurm_even_detached() -> None:
    """A detached shim still lives in Slurm's task cgroup: a memory cgroup of its own would nest there."""
    for detach in (False, True):
        with pytest.raises(UsageError, match="--mem-limit"):
            run_options(mem_limit="1G", engine=engine_options(SLURM_TASK, detach=detach))
    assert run_options(mem_limit="1G", engine=engine_options({}, detach=True)).mem_limit_bytes


def test_jobwarden_group_dir_is_stored_with_a_group_and_ignored_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"JOBWARDEN_GROUP_DIR": "shared"}
    assert engine_options(env, group="g")["group_dir"] == str(tmp_path / "shared")
    assert engine_options(env)["group_dir"] is None
    assert engine_options(env, group="g", group_dir="/mine")["group_dir"] == "/mine"
