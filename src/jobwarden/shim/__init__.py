"""The per-job supervising process: the only holder of job handles (pidfds, the wait status)."""
