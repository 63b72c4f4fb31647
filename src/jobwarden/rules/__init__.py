"""Pure judgement: evidence in, findings out. No I/O, no clock."""

from jobwarden.rules.death import explain
from jobwarden.rules.evidence import RunEvidence

__all__ = ["RunEvidence", "explain"]
