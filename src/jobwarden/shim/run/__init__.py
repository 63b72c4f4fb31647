"""The run and its lifecycle: starting or adopting the job, the supervising loop, ending the run, the
attempts of a restart policy, and what the loop asks of the operating system."""
