"""What the shim records and tells: the store writes that must not hurt the loop, the log cap's events,
a group's shared records, notifications, live findings and the run's fingerprint."""
