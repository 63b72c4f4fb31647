"""The pure comparison of two fingerprints (rules.changes): what `jobwarden diff`, `explain` and the job's
page say changed between two runs, and what they must not say."""

from __future__ import annotations

import json

from jobwarden.observations import Fingerprint, GitState
from jobwarden.rules.changes import Change, compare, summary

COMMIT_A = "1a2b3c4d" * 5
COMMIT_B = "9f8e7d6c" * 5


def fingerprint(**fields: object) -> Fingerprint:
    base: dict[str, object] = {
        "command": ("python", "train.py", "--lr", "3e-4"),
        "cwd": "/home/ana/exp",
        "env_keys": ("HF_TOKEN",),
        "host": "gpu-1",
        "jobwarden": "0.1.0",
        "python": "/home/ana/exp/.venv/bin/python",
        "python_version": "3.11.7",
        "packages": (("numpy", "2.1.0"), ("torch", "2.12.0")),
        "torch_cuda": "12.4",
        "git": GitState(COMMIT_A, "main", dirty=False),
        "cuda_visible": "0",
        "gpus": ("0 NVIDIA H100 80GB HBM3 GPU-1a2b3c4d",),
        "driver": "550.54.15",
        "cuda_driver": "12.4",
    }
    base.update(fields)
    return Fingerprint(**base)  # type: ignore[arg-type]


def lines(before: Fingerprint, after: Fingerprint) -> list[str]:
    return [c.line() for c in compare(before, after)]


def test_identical_runs_have_no_change() -> None:
    assert compare(fingerprint(), fingerprint()) == []


def test_a_package_upgrade_is_one_line_with_both_versions() -> None:
    after = fingerprint(packages=(("numpy", "2.1.0"), ("torch", "2.13.0")))
    assert lines(fingerprint(), after) == ["package torch 2.12.0 -> 2.13.0"]
    assert compare(fingerprint(), after) == [Change("package torch", "2.12.0", "2.13.0")]


def test_packages_added_and_removed_are_said_so() -> None:
    after = fingerprint(packages=(("torch", "2.12.0"), ("wandb", "0.19.1")))
    assert lines(fingerprint(), after) == [
        "package numpy removed (was 2.1.0)",
        "package wandb added (0.19.1)",
    ]


def test_a_new_commit_is_named_short_and_a_dirty_tree_is_marked() -> None:
    after = fingerprint(git=GitState(COMMIT_B, "main", dirty=True, diff_hash="ab" * 20))
    [change] = compare(fingerprint(), after)
    assert change.line() == "git commit 1a2b3c4 -> 9f8e7d6 (dirty)"
    assert (change.before, change.after) == (COMMIT_A, f"{COMMIT_B} (dirty)")  # whole in --json


def test_the_same_commit_with_other_uncommitted_changes_is_a_change_of_the_diff() -> None:
    before = fingerprint(git=GitState(COMMIT_A, "main", dirty=True, diff_hash="11" * 20))
    after = fingerprint(git=GitState(COMMIT_A, "main", dirty=True, diff_hash="22" * 20))
    assert lines(before, after) == ["git diff (uncommitted) 1111111 -> 2222222"]
    assert compare(before, before) == []


def test_a_tree_that_became_dirty_on_the_same_commit() -> None:
    after = fingerprint(git=GitState(COMMIT_A, "main", dirty=True, diff_hash="22" * 20))
    assert lines(fingerprint(), after) == ["git commit 1a2b3c4 -> 1a2b3c4 (dirty)"]


def test_a_branch_switch_on_the_same_commit_and_leaving_a_repository() -> None:
    assert lines(fingerprint(), fingerprint(git=GitState(COMMIT_A, "exp", dirty=False))) == [
        "git branch main -> exp"
    ]
    assert lines(fingerprint(), fingerprint(git=None)) == ["git commit 1a2b3c4 -> no repository"]


def test_env_keys_added_and_removed_never_carry_a_value() -> None:
    after = fingerprint(env_keys=("WANDB_MODE",))
    changes = compare(fingerprint(), after)
    assert [c.line() for c in changes] == ["env key HF_TOKEN removed", "env key WANDB_MODE added"]
    assert {c.before for c in changes} | {c.after for c in changes} == {None, "set"}


def test_python_host_gpus_and_driver() -> None:
    after = fingerprint(
        python_version="3.12.1",
        host="gpu-3",
        gpus=("0 NVIDIA A100-SXM4-80GB GPU-99887766",),
        driver="555.42.02",
        cuda_driver="12.5",
    )
    assert lines(fingerprint(), after) == [
        "python 3.11.7 -> 3.12.1",
        "host gpu-1 -> gpu-3",
        "gpus 0 NVIDIA H100 80GB HBM3 GPU-1a2b3c4d -> 0 NVIDIA A100-SXM4-80GB GPU-99887766",
        "nvidia driver 550.54.15 -> 555.42.02",
        "cuda driver 12.4 -> 12.5",
    ]


def test_the_command_and_its_directory_come_first() -> None:
    after = fingerprint(command=("python", "train.py", "--lr", "1e-3"), cwd="/home/ana/exp2")
    assert lines(fingerprint(), after) == [
        "command python train.py --lr 3e-4 -> python train.py --lr 1e-3",
        "cwd /home/ana/exp -> /home/ana/exp2",
    ]


def test_a_part_one_run_could_not_read_is_unknown_never_absent() -> None:
    after = fingerprint(git=None, packages=None, unknown=(("git", "no answer within 10 s"),))
    assert lines(fingerprint(), after) == [
        "git commit 1a2b3c4 -> unknown (no answer within 10 s)",
        "packages 2 installed -> unknown",
    ]
    both = fingerprint(git=None, unknown=(("git", "no answer within 10 s"),))
    assert compare(both, both) == []


def test_an_unset_and_an_empty_cuda_visible_devices_differ() -> None:
    assert lines(fingerprint(cuda_visible=None), fingerprint(cuda_visible="")) == [
        "CUDA_VISIBLE_DEVICES unset -> ''"
    ]


def test_the_summary_names_the_first_changes_and_counts_the_rest() -> None:
    changes = [Change(f"package p{i}", "1", "2") for i in range(9)]
    assert summary(changes, 2) == "package p0 1 -> 2; package p1 1 -> 2; and 7 more"
    assert summary(changes[:2], 2) == "package p0 1 -> 2; package p1 1 -> 2"


def test_a_change_as_json() -> None:
    change = Change("package torch", "2.12.0", "2.13.0")
    assert change.to_json() == {
        "what": "package torch",
        "before": "2.12.0",
        "after": "2.13.0",
        "line": "package torch 2.12.0 -> 2.13.0",
    }


def test_a_fingerprint_reads_back_from_its_json() -> None:
    original = fingerprint(unknown=(("gpus", "NVML: driver not loaded"),))
    assert Fingerprint.from_json(json.loads(json.dumps(original.to_json()))) == original
    stored = json.loads(json.dumps(original.to_json(packages=False)))
    assert "packages" not in stored
    assert Fingerprint.from_json(stored, original.packages) == original
