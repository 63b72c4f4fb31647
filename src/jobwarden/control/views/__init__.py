"""What every frontend reads of jobs: the job list and live processes (joblist), one job (jobstatus),
`top`'s pass (top), a group's merged records (group), a run's log (joblog) and metrics (metrics), and what
a job runs under (runsunder)."""
