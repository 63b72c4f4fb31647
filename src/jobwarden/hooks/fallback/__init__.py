"""The directory the hooks append to the end of a job's sys.path: a minimal `jobwarden` package with only
`heartbeat`, for interpreters that do not have jobwarden installed. An installed jobwarden comes first.

This file makes it a package for packaging and type checking; the job's interpreter never imports it."""
