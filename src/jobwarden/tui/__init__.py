"""`jobwarden top`: a live terminal view of the jobs (textual, the `tui` extra).

Nothing here is imported unless `top` runs: the package's modules import textual and rich at their top,
and `cli.commands.top` imports `tui.command` inside its handler only. Every read and action goes
through `control`, like the CLI's."""
