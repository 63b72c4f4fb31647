"""`jobwarden doctor`: the facts it gathers (hostfacts), the data they and each check's verdict are
(facts), the checks and the report (checks), and what it sees inside a container (container)."""
