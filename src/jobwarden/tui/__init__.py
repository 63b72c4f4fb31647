"""`jobwarden top`: a live terminal view of the jobs (textual, the `tui` extra).

Nothing here is imported unless `top` runs: the package's modules import textual and rich at their top,
and `cli.handlers` imports `tui.command` inside the `top` handler only. Every read and action goes
through `control`, like the CLI's."""
