"""Admission: what a run waits for before it starts (its turn, its GPUs) and what it may use once it runs
(memory, GPUs): the queues, GPU claims and who holds a GPU."""
