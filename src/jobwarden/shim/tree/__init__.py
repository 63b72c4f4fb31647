"""The job's process tree: its members held by identity, how each process ended (the short-lived ones
too), the hooks' files of ended processes, and whose job an outside process is."""
