"""A run's verdict read back from what was recorded: the shim's live findings joined with what the rules
conclude from the run's end (`explainer`), and the signs of progress as the hang watchdog counts them
(`signs`). Read by the shim at a run's end and by control's views alike, so it lies below both."""
