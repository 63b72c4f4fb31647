"""Observers: read-only views of processes, found by marker or identity."""
