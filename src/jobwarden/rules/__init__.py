"""Pure judgement: evidence in, findings out. No I/O, no clock.

`explain(ev)` runs every family over one run (verdict.py says in which order findings come); machine-wide
GPU strays are judged by `rules.gpu.stray_gpu_findings`.

The package loads its families only when `explain` is first asked for: a module of it alone (rules.retry
for the shim's restart decision, rules.gpu) must not cost the shim every rule's import.
"""

import typing as _typing

from jobwarden.rules.evidence import RunEvidence

if _typing.TYPE_CHECKING:
    from jobwarden.rules.verdict import explain

__all__ = ["RunEvidence", "explain"]


def __getattr__(name: str) -> _typing.Any:
    if name == "explain":
        from jobwarden.rules.verdict import explain

        return explain
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
