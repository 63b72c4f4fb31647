"""Pure judgement: evidence in, findings out. No I/O, no clock.

`explain(ev)` runs every family over one run (verdict.py says in which order findings come); machine-wide
GPU strays are judged by `rules.gpu.stray_gpu_findings`.
"""

from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.verdict import explain

__all__ = ["RunEvidence", "explain"]
