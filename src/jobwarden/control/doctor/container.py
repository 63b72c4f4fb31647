"""`jobwarden doctor` inside a container: what jobwarden can and cannot see there, said plainly
(DESIGN "In a container"). Pure functions of the facts control.doctor.hostfacts gathers, as the other checks.

Inside a container the memory cgroup is the container's own, mounted read-only: jobwarden makes none of its
own, but the container's OOM counter (v1 memory.oom_control, v2 memory.events) is readable, and it is what
`explain` names an OOM kill from. The kernel log is not (no /dev/kmsg, or dmesg_restrict without
CAP_SYSLOG), so victims are known by their SIGKILL; the kernel's process events are never sent into a pid
namespace other than the host's (cn_proc refuses them), so short-lived processes are seen by the Python hooks.
"""

from __future__ import annotations

from jobwarden.config import format_size
from jobwarden.control.doctor.facts import OK, Check, HostFacts


def enclosing_counts(enclosing: tuple[str, int | None]) -> str:
    """'OOM kills are counted by the cgroup jobwarden runs in (cgroup-v1 /sys/..., limit 150.0M)...'."""
    where, limit = enclosing
    limit_text = f", limit {format_size(limit)}" if limit is not None else ", no limit of its own"
    return f"OOM kills are counted by the cgroup jobwarden runs in ({where}{limit_text}): explain names them"


def check_container(facts: HostFacts) -> Check:
    """Where we are, what `run` does here, and what can and cannot be seen."""
    said = ", ".join(facts.container)
    pid1 = f"; PID 1 is {facts.pid1}" if facts.pid1 else ""
    parts = [
        f"in a container ({said}{pid1}): `jobwarden run` as its main process (PID 1, or under --init's "
        "tini or catatonit) stays attached, reaps its zombies, turns its stop into an engine stop and "
        "exits with the job's status"
    ]
    if facts.enclosing_oom is not None:
        parts.append(enclosing_counts(facts.enclosing_oom))
    else:
        parts.append("no cgroup counts OOM kills here: an OOM kill is known only as a SIGKILL")
    if facts.kernel_log:
        parts.append(f"{facts.kernel_log}: OOM victims are named by their SIGKILL and the counters")
    if facts.pid_namespace:
        parts.append(
            "its own pid namespace: no kernel process events (the kernel sends them to the host's only); "
            "short-lived processes are seen by the Python hooks and the 1 s scan"
        )
    return Check("container", OK, "; ".join(parts))
