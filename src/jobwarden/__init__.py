"""jobwarden: supervise long-running jobs so they never die silently, never hang unnoticed, and never leave
orphans behind."""

__version__ = "0.1.0"

__all__ = ["__version__"]
