"""Pure judgement: evidence in, findings out. No I/O, no clock.

`explain(ev)` runs every family over one run (verdict.py says in which order findings come); machine-wide
GPU strays are judged by `rules.gpu.stray_gpu_findings`.

The package loads its families and the evidence record only when first asked for them: a module of it
alone (rules.retry, the shim's restart decision) must not cost the end of every run their imports.
"""

import typing as _typing

if _typing.TYPE_CHECKING:
    from jobwarden.rules.evidence import RunEvidence
    from jobwarden.rules.verdict import explain

__all__ = ["RunEvidence", "explain"]


def __getattr__(name: str) -> _typing.Any:
    if name == "explain":
        from jobwarden.rules.verdict import explain

        return explain
    if name == "RunEvidence":
        from jobwarden.rules.evidence import RunEvidence

        return RunEvidence
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
