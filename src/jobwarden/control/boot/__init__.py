"""Runs and reboots: `jobwarden boot enable|disable|status` (startup: `resume` at every boot) and the runs
an earlier boot ended (reboot: marking them, `jobwarden resume`)."""
