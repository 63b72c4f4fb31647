"""What a rank's group records say about it, read from this machine: its torchelastic error file, its
exception, its place in Slurm, the boot it runs in (shim.record.groupsink writes them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jobwarden.model import Finding
from jobwarden.store import groupdir

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "rule": finding.rule,
        "title": finding.title,
        "summary": finding.summary,
        "evidence": list(finding.evidence[:8]),
        "pids": list(finding.pids),
    }


def exception_of(lines: list[str], rank: int | None, shared_output: bool) -> str | None:
    """The last traceback in the output; under a launcher only a rank's own (torchrun prefixes its lines
    with `[rankN]:`): the ranks of a node share one output, and a peer's traceback is not this rank's."""
    from jobwarden.rules.death import parse_traceback

    if rank is not None:
        own = [line.split(":", 1)[1] for line in lines if line.startswith(f"[rank{rank}]:")]
        lines = own or ([] if shared_output else lines)
    parsed = parse_traceback(lines)
    return f"{parsed[0]}: {parsed[1]}{at_where(parsed[2])}" if parsed else None


def at_where(where: str | None) -> str:
    return f" @ {where}" if where else ""


def torch_error(path: str | None) -> dict[str, Any] | None:
    """The summary of torchelastic's error file (TORCHELASTIC_ERROR_FILE), when the rank wrote one."""
    doc = groupdir.read_document(Path(path)) if path else None
    if not doc:
        return None
    message = doc.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return {"message": message.get("message"), "timestamp": extra.get("timestamp")}
    return {"message": message}


def error_file(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(ERROR_FILE_ENV.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def is_slurm_task(engine: str | None, rank: int | None) -> bool:
    """The rank is Slurm's task number (the default of --rank under Slurm), not one the user gave."""
    procid = os.environ.get("SLURM_PROCID")
    return engine == "slurm" and rank is not None and procid is not None and procid == str(rank)


def world_size(env: dict[str, str]) -> int | None:
    text = env.get("WORLD_SIZE") or os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
    return int(text) if text and text.isdecimal() else None


def nodelist() -> str | None:
    return os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None
