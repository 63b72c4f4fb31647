"""What a process of the job is called in findings (rules.naming): by what it is, its rank, the code it
ran, its command; "worker" only for a pool's or a DataLoader's workers. Before, every process but the main
one was "Worker pid N": a Manager's server, a Popen child and a shell's command alike."""

from __future__ import annotations

import pytest

from jobwarden.observations import Frame, ProcessDeath, ProcessStack, ThreadStack
from jobwarden.rules import explain
from jobwarden.rules.naming import process_name, short_command

from .test_rules_causal import MAIN, T, failed, main_death

SPAWNED = (
    "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; "
    "spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork"
)
TRACKER = "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(6)"
MANAGER_LOOP = Frame("serve_forever", "/usr/lib/python3.11/multiprocessing/managers.py", 185)
POOL_LOOP = Frame("worker", "/usr/lib/python3.11/multiprocessing/pool.py", 125)


@pytest.mark.parametrize(
    ("cmdline", "frames", "role", "rank", "name"),
    [
        ("sort -k2 big.txt", (), "worker", None, "process pid 9 (sort)"),
        ("/bin/sh -c 'sleep 1; exit 3'", (), "worker", None, "process pid 9 (sh -c sleep)"),
        ("python3 /srv/prep.py --fast", (), "worker", None, "process pid 9 (prep.py)"),
        ("python -m torch.distributed.run x.py", (), "worker", None, "process pid 9 (torch.distributed.run)"),
        ("python train.py", (MANAGER_LOOP,), "worker", None, "multiprocessing Manager server (pid 9)"),
        (TRACKER, (), "worker", None, "multiprocessing resource tracker (pid 9)"),
        (SPAWNED, (), "worker", None, "multiprocessing child (pid 9)"),
        ("python train.py", (POOL_LOOP,), "worker", None, "Pool worker pid 9"),
        ("python etl.py", (), "ProcessPoolExecutor worker", None, "ProcessPoolExecutor worker pid 9"),
        ("python train.py", (), "DataLoader worker", None, "DataLoader worker pid 9"),
        ("python train.py", (), "worker", 3, "rank 3 (pid 9)"),
        ("python train.py", (), "rank", None, "process pid 9 (train.py)"),  # a launcher's helper, no rank
        ("", (), "worker", None, "process pid 9"),
        ("[child of pid 4] python x.py", (), "worker", None, "process pid 9 (child of pid 4)"),  # died unseen
        ("[sort]", (), "worker", None, "process pid 9 (sort)"),  # a zombie: its comm
    ],
)
def test_a_process_is_named_by_what_it_is(
    cmdline: str, frames: tuple[Frame, ...], role: str, rank: int | None, name: str
) -> None:
    assert process_name(9, cmdline, frames, role, rank) == name


def test_a_short_command_is_cut_and_never_fails() -> None:
    assert short_command("'unbalanced") == "'unbalanced"
    assert len(short_command("/opt/" + "x" * 300)) == 40
    assert short_command("") == ""


def test_a_popen_child_that_failed_first_is_named_by_its_command() -> None:
    child = ProcessDeath(811, MAIN, "sort -k2 /data/big.txt", T + 1.0, 2, None)
    ev = failed(deaths=(child, main_death(T + 1.2)), log_tail=("sort: cannot read: /data/big.txt",))
    first = explain(ev)[0]
    assert first.pids[0] == 811
    assert first.summary.startswith("Process pid 811 (sort) exited with code 2"), first.summary
    assert "orker" not in first.title + first.summary


def test_a_manager_server_that_failed_first_is_named_by_its_stack() -> None:
    server = ProcessDeath(812, MAIN, "python train.py", T + 1.0, None, "SIGKILL")
    stack = ProcessStack(812, "py-spy", (ThreadStack(812, "MainThread", (MANAGER_LOOP,)),))
    ev = failed(deaths=(server, main_death(T + 1.2)), last_stacks={812: stack})
    first = explain(ev)[0]
    assert first.summary.startswith("Multiprocessing Manager server (pid 812) was killed by SIGKILL")
