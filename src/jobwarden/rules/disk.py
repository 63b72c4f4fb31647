"""The disk holding the job's log filled up (`disk-full`): a warning while the job ran on, the root cause
when the job then failed with a bare exit code while the disk was still full.

A job whose output cannot be written gets ENOSPC from write(2); most programs then exit 1 ("No space left
on device"), and what they said about it went nowhere: the log is on the full disk, as are the Python
hooks' records. "Exited with code 1, no clearer sign why" is then the wrong answer and "the job itself ran
on" a contradiction: the full disk is the likeliest cause.
"""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.rules.evidence import RunEvidence


def disk_full(ev: RunEvidence) -> Finding | None:
    """The episode, as a warning: output was lost, the job ran on."""
    if not ev.disk_full:
        return None
    where = _where(ev)
    return Finding(
        "disk-full",
        "The disk holding the job's log filled up: output was dropped",
        f"The filesystem of {where} ran out of space while the job ran. What the job wrote to its output "
        "then is lost, and jobwarden could record nothing until space came back; the job itself ran on.",
        "warning",
        (
            f"output lost: no space left on device under {where}",
            "see the disk-full and disk-ok events: jobwarden status --json",
        ),
        _remedy(where),
        _pids(ev),
    )


def disk_full_cause(ev: RunEvidence, ended: Finding | None) -> Finding | None:
    """The episode as the run's root cause, in place of `ended`: a bare non-zero exit of the main process
    (rule exit-code) while the disk was still full. None otherwise: a signal, an exception, a cause found
    by another rule, or a disk that had room again before the end explain the run better."""
    if not ev.disk_full or ended is None or ended.rule != "exit-code" or not full_at_the_end(ev):
        return None
    if ev.signal is not None or ev.exit_code in (None, 0):
        return None
    where = _where(ev)
    return Finding(
        "disk-full",
        f"The job failed while the disk holding its log was full (exit code {ev.exit_code})",
        f"The filesystem of {where} ran out of space while the job ran, and was still full when the main "
        f"process exited with code {ev.exit_code}: its writes there failed with ENOSPC (no space left on "
        "device), the likeliest reason it failed. What it wrote meanwhile, its error message too, is lost.",
        "error",
        (
            f"exit code {ev.exit_code} while no space was left on device under {where}",
            *(line for line in ended.evidence if line.startswith("output: ")),
            "see the disk-full event: jobwarden status --json",
        ),
        _remedy(where) + ", then run the job again",
        ended.pids or _pids(ev),
    )


def full_at_the_end(ev: RunEvidence) -> bool:
    """Whether the disk was still full when the run ended: its last disk event says full (the shim looks
    at the disk once more before it records the end)."""
    last = next((kind for kind in reversed(ev.events) if kind in ("disk-full", "disk-ok")), None)
    return last == "disk-full"


def _where(ev: RunEvidence) -> str:
    return ", ".join(sorted(set(ev.disk_full)))


def _remedy(where: str) -> str:
    return f"free space there (df -h {where}), or keep JOBWARDEN_HOME on a disk with room for the logs"


def _pids(ev: RunEvidence) -> tuple[int, ...]:
    return (ev.pid,) if ev.pid else ()
