"""Memory inside a container's limit (`podman run --memory`, a pod's resources.limits.memory): an OOM kill is
named `oom-kill` from the container's own cgroup, and the founding incident, a multiprocessing.Pool whose
worker the OOM killer took, ends the container non-zero with --on-hang stop instead of hanging for ever."""

from __future__ import annotations

import pytest

from tests.conftest import make_fifo, read_fifo, write_fifo

from .conftest import Box
from .helpers import add_job, data, ended, events, rules

pytestmark = [pytest.mark.integration, pytest.mark.container]

HOG = "b = []\nwhile True: b.append(bytearray(10 << 20))"


def test_an_oom_kill_under_the_containers_limit_is_named_from_its_cgroup(box: Box) -> None:
    log = box.tmp / "termination-log"
    container = box.entrypoint(
        "--requeue-exit", "200", "--", "python3", "-c", HOG, memory="150m", termination_log=log
    )
    done = container.run()
    assert done.returncode == 137, done.stderr  # the job's status; an OOM is never worth a requeue
    assert (
        container.inspect("{{.State.OOMKilled}}") == "true"
    )  # what the runtime says (Kubernetes' OOMKilled)
    run, found, _ = ended(box.home)
    assert run.signal == "SIGKILL" and run.containment is not None
    assert run.containment.startswith("subreaper")  # no cgroup of its own: the container's is the job's
    assert rules(found)[0] == "oom-kill", rules(found)
    (oom,) = data(events(box.home), "oom")[-1:]
    assert oom["mechanism"] == "cgroup-v1" and oom["limit_bytes"] == 150 << 20 and oom["kills"] >= 1
    text = log.read_text()
    assert "[oom-kill]" in text and "the container at its 150.0M limit" in text, text
    assert "resources.limits.memory" in text  # the remedy names the container's limit, not --mem-limit


def test_a_pool_whose_worker_was_oom_killed_ends_the_container(box: Box) -> None:
    """The founding incident: a worker of a multiprocessing.Pool is OOM-killed inside the container's
    limit; its parent waits for the result for ever. With the README's entrypoint (--on-hang stop) the
    hang ends the container non-zero, so its restart policy restarts it, with the cause named."""
    make_fifo(box.tmp / "pool")
    make_fifo(box.tmp / "pool.go")
    log = box.tmp / "termination-log"
    container = box.entrypoint(
        "--on-hang",
        "stop",
        "--requeue-exit",
        "200",
        "--hang-timeout",
        "3s",
        "--grace",
        "2s",
        "--",
        "python3",
        add_job(box.tmp, "pool_lost_worker.py"),
        "/t/pool",
        "oom",
        memory="250m",
        termination_log=log,
    )
    container.start()
    read_fifo(box.tmp / "pool")  # the worker's pid: it waits for the word to allocate
    write_fifo(box.tmp / "pool.go")
    status = container.wait(timeout=120)
    assert status not in (0, 200), status  # non-zero: restarted by the policy; never a requeue for an OOM
    run, found, _ = ended(box.home)
    assert str(run.state) == "failed" and run.end_reason == "hung", run
    assert rules(found)[:2] == ["oom-kill", "pool-worker-lost"], rules(found)
    hung = data(events(box.home), "hung")
    assert hung and hung[0]["action"] == "stop"
    text = log.read_text()
    assert "[oom-kill]" in text.splitlines()[1] and "pool-worker-lost" in text, text
