"""What changed between two runs: their fingerprints (observations.Fingerprint) compared, part by part, in
the order a failure is most often traced to them: the command, the code (git), the interpreter and its
packages, the environment, then the machine. Pure: `jobwarden diff`, `explain` and the job's page all
read `compare`'s answer.

A value is a string as it is shown; None only for something absent (an `--env` key, a package). A part
one run could not read (git timed out) is `unknown (why)`, never taken for absent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobwarden.observations import Fingerprint, GitState

SET = "set"  # an --env key that is present: its value is never read
_LONG_HASH = re.compile(r"\b[0-9a-f]{40,64}\b")


@dataclass(frozen=True)
class Change:
    """One difference, `before` in the earlier run, `after` in the later one."""

    what: str  # "package torch", "git commit", "env key WANDB_MODE", "python", "host"...
    before: str | None  # None: absent from that run
    after: str | None

    def line(self) -> str:
        """`package torch 2.12.0 -> 2.13.0`, `env key WANDB_MODE added`, `git commit 1a2b3c4 -> 9f8e7d6`."""
        if self.before is None:
            return f"{self.what} added" + ("" if self.after == SET else f" ({_short(self.after)})")
        if self.after is None:
            return f"{self.what} removed" + ("" if self.before == SET else f" (was {self.before})")
        return f"{self.what} {_short(self.before)} -> {_short(self.after)}"

    def to_json(self) -> dict[str, str | None]:
        return {"what": self.what, "before": self.before, "after": self.after, "line": self.line()}


def _short(value: str | None) -> str:
    """A commit or diff hash as git shows it short: 7 characters."""
    return _LONG_HASH.sub(lambda m: m.group(0)[:7], value or "")


def compare(before: Fingerprint, after: Fingerprint) -> list[Change]:
    """Every difference from `before` (the earlier run) to `after`; empty when nothing changed."""
    return [change for part in _PARTS for change in part(before, after)]


def summary(changes: Sequence[Change], most: int = 6) -> str:
    """The changes on one line, the first `most` of them: "torch 2.12.0 -> 2.13.0; git commit ...; and 3
    more"."""
    shown = "; ".join(c.line() for c in changes[:most])
    left = len(changes) - most
    return f"{shown}; and {left} more" if left > 0 else shown


# --- the parts, in order ------------------------------------------------------------------------------


def _one(what: str, before: str | None, after: str | None) -> list[Change]:
    return [] if before == after else [Change(what, before, after)]


def _command(a: Fingerprint, b: Fingerprint) -> list[Change]:
    return _one("command", _argv(a.command), _argv(b.command)) + _one("cwd", a.cwd, b.cwd)


def _argv(command: Sequence[str]) -> str:
    from shlex import quote

    return " ".join(quote(word) for word in command)


def _git(a: Fingerprint, b: Fingerprint) -> list[Change]:
    before, after = _known(a, "git", _commit(a.git)), _known(b, "git", _commit(b.git))
    if before != after:
        return [Change("git commit", before, after)]
    if a.git is None or b.git is None or a.why_unknown("git") or b.why_unknown("git"):
        return []
    changes = _one("git diff (uncommitted)", a.git.diff_hash, b.git.diff_hash) if a.git.dirty else []
    return changes + _one("git branch", a.git.branch or "(detached)", b.git.branch or "(detached)")


def _commit(git: GitState | None) -> str:
    """`9f8e7d6... (dirty)`: the commit, and whether tracked files differed from it."""
    if git is None:
        return "no repository"
    commit = git.commit or "(no commit yet)"
    return f"{commit} (dirty)" if git.dirty else commit


def _known(fp: Fingerprint, part: str, value: str | None) -> str | None:
    why = fp.why_unknown(part)
    return f"unknown ({why})" if why else value


def _python(a: Fingerprint, b: Fingerprint) -> list[Change]:
    before = _known(a, "python", a.python_version or "none")
    after = _known(b, "python", b.python_version or "none")
    return _one("python", before, after) + _one("python interpreter", a.python or "none", b.python or "none")


def _packages(a: Fingerprint, b: Fingerprint) -> list[Change]:
    if a.packages is None or b.packages is None:
        before = _known(a, "packages", None if a.packages is None else f"{len(a.packages)} installed")
        after = _known(b, "packages", None if b.packages is None else f"{len(b.packages)} installed")
        return _one("packages", before or "unknown", after or "unknown")
    old, new = dict(a.packages), dict(b.packages)
    return [
        Change(f"package {name}", old.get(name), new.get(name))
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def _torch(a: Fingerprint, b: Fingerprint) -> list[Change]:
    return _one("torch CUDA build", a.torch_cuda or "none", b.torch_cuda or "none")


def _env(a: Fingerprint, b: Fingerprint) -> list[Change]:
    old, new = set(a.env_keys), set(b.env_keys)
    return [
        Change(f"env key {key}", SET if key in old else None, SET if key in new else None)
        for key in sorted(old ^ new)
    ]


def _machine(a: Fingerprint, b: Fingerprint) -> list[Change]:
    return (
        _one("host", a.host, b.host)
        + _one("CUDA_VISIBLE_DEVICES", _unset(a.cuda_visible), _unset(b.cuda_visible))
        + _one("gpus", _gpus(a), _gpus(b))
        + _one("nvidia driver", a.driver or "none", b.driver or "none")
        + _one("cuda driver", a.cuda_driver or "none", b.cuda_driver or "none")
        + _one("jobwarden", a.jobwarden, b.jobwarden)
    )


def _unset(value: str | None) -> str:
    return "unset" if value is None else repr(value) if value == "" else value


def _gpus(fp: Fingerprint) -> str:
    if fp.gpus is None:
        return _known(fp, "gpus", None) or "unknown"
    return "; ".join(fp.gpus) if fp.gpus else "none"


_PARTS: tuple[Callable[[Fingerprint, Fingerprint], list[Change]], ...] = (
    _command,
    _git,
    _python,
    _packages,
    _torch,
    _env,
    _machine,
)
