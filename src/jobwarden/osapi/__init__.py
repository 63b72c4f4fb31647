"""The only code that forks, execs, signals, waits, and calls prctl/pidfd/ioctl; and the /proc readers."""
