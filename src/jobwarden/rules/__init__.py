"""Pure judgement: evidence in, findings out. No I/O, no clock."""

from jobwarden.rules.death import RunEvidence, explain

__all__ = ["RunEvidence", "explain"]
